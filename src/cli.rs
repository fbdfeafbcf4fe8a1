//! The command line: `serve` (the default), `token`, `migrate`, `demo-agent`, `connect`.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::app::{Application, shutdown_signal};
use crate::identity::auth::Authenticator;
use crate::infra::config::{CliOverrides, Config};

/// A multi-user WebSocket gateway for ACP agents.
#[derive(Debug, Parser)]
#[command(name = "acp-gateway", version, about)]
pub struct Cli {
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Options every command that reads the configuration takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConfigArgs {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Listen address (overrides ACP_GATEWAY_LISTEN and the file).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Database URL (overrides DATABASE_URL and the file).
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
}

impl ConfigArgs {
    fn load(&self) -> anyhow::Result<Config> {
        let cli = CliOverrides {
            config_file: self.config.clone(),
            listen: self.listen.clone(),
            database_url: self.database_url.clone(),
        };
        Ok(Config::load(&cli)?)
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve(ConfigArgs),
    /// Print a JWT for a user, signed with the configured HS256 secret.
    Token {
        /// The user (`sub`).
        #[arg(long)]
        sub: String,
        /// Lifetime in seconds (default: jwt.default_ttl_secs, 30 days).
        #[arg(long)]
        ttl: Option<u64>,
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Apply database migrations and exit.
    Migrate(ConfigArgs),
    /// Run the built-in demo ACP agent on stdin/stdout.
    DemoAgent(crate::agents::demo::DemoAgentOptions),
    /// An ACP agent on stdin/stdout for editors: your sessions on the gateway at URL.
    Connect(crate::editor::ConnectArgs),
    /// Sign this machine in to the gateway at URL (a code to approve in your browser).
    Login {
        /// The gateway's base URL.
        url: String,
    },
    /// Forget (and revoke) this machine's token for the gateway at URL (every gateway's without).
    Logout {
        /// The gateway's base URL.
        url: Option<String>,
    },
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command.unwrap_or(Command::Serve(ConfigArgs::default())) {
        Command::Serve(args) => serve(args.load()?).await,
        Command::Token { sub, ttl, config } => {
            let config = config.load()?;
            let auth = Authenticator::from_config(&config.jwt, &config.data_dir)?;
            println!("{}", auth.mint(&sub, ttl.unwrap_or(config.jwt.default_ttl_secs))?);
            Ok(())
        }
        Command::Migrate(args) => {
            let config = args.load()?;
            crate::store::connect(&config.database_url)
                .await
                .with_context(|| format!("migrating {}", crate::app::redact(&config.database_url)))?;
            eprintln!("migrations applied to {}", crate::app::redact(&config.database_url));
            Ok(())
        }
        Command::DemoAgent(opts) => crate::agents::demo::run(opts).await,
        Command::Connect(args) => crate::editor::run(args).await,
        Command::Login { url } => crate::editor::login::login(&parse_url(&url)?).await,
        Command::Logout { url: Some(url) } => crate::editor::login::logout(&parse_url(&url)?).await,
        Command::Logout { url: None } => {
            for url in crate::editor::login::signed_in()? {
                crate::editor::login::logout(&url).await?;
            }
            Ok(())
        }
    }
}

fn parse_url(url: &str) -> anyhow::Result<url::Url> {
    url::Url::parse(url).with_context(|| format!("the gateway URL {url:?}"))
}

async fn serve(config: Config) -> anyhow::Result<()> {
    crate::infra::telemetry::init_metrics();
    let app = Application::build(config).await?;
    let addr = app.local_addr();
    tracing::info!(%addr, "acp-gateway listening");
    let gw = app.gateway();
    if gw.identity.auth.can_mint() {
        // A one-time code, not a token: it works once, for minutes, and only in this process.
        let code = gw.identity.login_codes.issue("local");
        let minutes = crate::identity::auth::codes::DEFAULT_CODE_TTL.as_secs() / 60;
        println!(
            "acp-gateway is running. Web UI, signed in as user `local` (this link works once, within {minutes} minutes):\n  http://{addr}/auth/login?code={code}"
        );
    } else {
        println!("acp-gateway is running at http://{addr}/ (tokens come from your identity provider)");
    }
    app.run_until_stopped(shutdown_signal()).await
}
