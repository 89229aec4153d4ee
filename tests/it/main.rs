//! Integration tests, compiled into one binary. Golden data under `golden/`
//! is made by `make golden` (python/golden/make_golden.py) with transformers.

mod bad_input;
mod build;
mod checkpoint;
mod cli_snapshots;
mod common;
mod coreai;
mod corpus;
mod docs;
mod embed;
mod encoders;
mod families;
mod faults;
mod gate;
mod hub;
mod interp;
mod last_mile;
mod layering;
mod library;
mod lm;
mod naflex;
mod parity;
mod qwen_remedy;
mod residency_rules;
mod text;
mod vqa;
