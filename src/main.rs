//! `acp-gateway`: see the library's documentation for the layout.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = acp_gateway::cli::Cli::parse();
    // The demo agent speaks ACP on stdout; its logs (like everyone's) go to stderr.
    acp_gateway::telemetry::init_logs("info,sqlx=warn");
    match acp_gateway::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
