fn main() -> std::process::ExitCode {
    // SAFETY: first thing in main, before any other thread starts.
    if let Some(w) = unsafe { ane_export::blas::init() } {
        eprintln!("{w}");
    }
    ane_export::cli::reset_sigpipe();
    ane_export::cli::exit_on_interrupt();
    ane_export::cli::keep_freed_memory();
    let cli: ane_export::cli::ExportCli = ane_export::cli::parse();
    let json = cli.json();
    ane_export::cli::finish(ane_export::cli::run_export(cli), json)
}
