//! `acp-gateway`: see the library's documentation for the layout.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = acp_gateway::cli::Cli::parse();
    const LOG_FILTER: &str = "info,sqlx=warn";
    // Traces only for the gateway itself, and only when an OTLP endpoint is configured.
    let serving = matches!(cli.command, None | Some(acp_gateway::cli::Command::Serve(_)));
    let traces = serving.then(|| acp_gateway::infra::traces::init(LOG_FILTER)).flatten();
    // The demo agent speaks ACP on stdout; its logs (like everyone's) go to stderr.
    acp_gateway::infra::telemetry::init_logs(LOG_FILTER);
    let outcome = acp_gateway::cli::run(cli).await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
