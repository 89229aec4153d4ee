fn main() -> std::process::ExitCode {
    // SAFETY: first thing in main, before any other thread starts.
    if let Err(code) = unsafe { ane_export::cli::open_blas() } {
        return code;
    }
    ane_export::cli::reset_sigpipe();
    ane_export::cli::exit_on_interrupt();
    ane_export::cli::keep_freed_memory();
    let cli: ane_export::cli::RunCli = ane_export::cli::parse();
    let json = cli.json();
    ane_export::cli::finish(ane_export::cli::run_run(cli), json)
}
