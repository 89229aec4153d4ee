use clap::Parser;

fn main() -> std::process::ExitCode {
    ane_export::cli::reset_sigpipe();
    let cli = ane_export::cli::ExportCli::parse();
    ane_export::cli::finish(ane_export::cli::run_export(cli))
}
