use clap::Parser;

fn main() -> std::process::ExitCode {
    ane_export::cli::reset_sigpipe();
    let cli = ane_export::cli::RunCli::parse();
    ane_export::cli::finish(ane_export::cli::run_run(cli))
}
