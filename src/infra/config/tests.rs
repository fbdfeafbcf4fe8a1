//! Loading: layers, environment names, refusals.

use super::*;
use std::io::Write;

fn load(file: Option<&str>, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut tmp = tempfile::NamedTempFile::new().expect("tempfile");
    let cli = match file {
        Some(text) => {
            tmp.write_all(text.as_bytes()).expect("write");
            CliOverrides {
                config_file: Some(tmp.path().to_path_buf()),
                ..Default::default()
            }
        }
        None => CliOverrides::default(),
    };
    let env: BTreeMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Config::load_with_env(&cli, |k| env.get(k).cloned())
}

#[test]
fn defaults_run_the_demo_agent() {
    let c = load(None, &[]).expect("defaults load");
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.agents[DEFAULT_AGENT].args, vec!["demo-agent", "--showcase"]);
    assert_eq!(c.sqlite_path(), Some(Path::new("data/acp-gateway.db")));
}

#[test]
fn env_overrides_file_and_splits_agent() {
    let c = load(
        Some("listen = \"127.0.0.1:9000\"\n[agents.default.pool]\nmax_processes = 3\n[agents.py]\ncommand = \"python3\"\nargs = [\"a.py\"]\n"),
        &[("ACP_GATEWAY_LISTEN", "127.0.0.1:9100"), ("ACP_GATEWAY_AGENT", "npx -y 'my agent'"), ("ACP_GATEWAY_JWT_SECRET", "12345678901234567890123456789012")],
    )
    .expect("loads");
    assert_eq!(c.listen.port(), 9100);
    assert_eq!(c.agents[DEFAULT_AGENT].command, "npx");
    assert_eq!(c.agents[DEFAULT_AGENT].args, vec!["-y", "my agent"]);
    assert_eq!(c.agents[DEFAULT_AGENT].pool.max_processes, 3);
    assert_eq!(c.agents["py"].args, vec!["a.py"]);
    assert!(c.jwt.secret.is_some(), "a numeric secret stays a string");
    let c = load(None, &[("ACP_GATEWAY_LISTEN", "localhost:9200")]).expect("a host name");
    assert_eq!(c.listen.to_string(), "127.0.0.1:9200");
    assert_eq!(c.request_database_url, None);
    let c = load(
        Some("request_database_url = \"postgres://file@db/acp\"\n"),
        &[("ACP_GATEWAY_REQUEST_DATABASE_URL", "postgres://web@db/acp")],
    )
    .expect("a request login");
    assert_eq!(c.request_database_url.as_deref(), Some("postgres://web@db/acp"));
}

#[test]
fn signin_timeout_from_file_and_env() {
    assert_eq!(load(None, &[]).expect("loads").signin.terminal_timeout_secs, 600);
    let file = Some("[signin]\nterminal_timeout_secs = 30\n");
    assert_eq!(load(file, &[]).expect("loads").signin.terminal_timeout_secs, 30);
    let env = [("ACP_GATEWAY_SIGNIN_TERMINAL_TIMEOUT_SECS", "45")];
    assert_eq!(load(file, &env).expect("loads").signin.terminal_timeout_secs, 45);
    let env = [("ACP_GATEWAY_SIGNIN_TERMINAL_TIMEOUT_SECS", "soon")];
    let err = load(None, &env).expect_err("not a number").to_string();
    assert!(err.contains("ACP_GATEWAY_SIGNIN_TERMINAL_TIMEOUT_SECS"), "{err}");
}

#[test]
fn bad_file_names_file_key_and_expectation() {
    let err = load(
        Some("[agents.x]\ncommand = \"a\"\n[agents.x.pool]\nmax_processes = \"many\"\n"),
        &[],
    )
    .expect_err("must fail");
    let msg = err.to_string();
    assert!(msg.contains("agents.x.pool.max_processes"), "{msg}");
    assert!(msg.contains(".tmp") || msg.contains("TOML"), "names the file: {msg}");
    assert!(msg.contains("expected"), "{msg}");
    let err = load(Some("lisen = 1\n"), &[]).expect_err("unknown key");
    assert!(err.to_string().contains("lisen"), "{err}");
}

#[test]
fn network_is_open_unless_egress_only_is_asked_and_that_needs_a_sandbox() {
    let c = load(None, &[]).expect("defaults");
    assert_eq!(
        c.agents[DEFAULT_AGENT].network,
        NetworkMode::Open,
        "the network stays on"
    );
    let c = load(Some("[agents.default]\nnetwork = \"egress-only\"\n"), &[]).expect("loads");
    assert_eq!(c.agents[DEFAULT_AGENT].network, NetworkMode::EgressOnly);
    let c = load(Some("[agents.default]\nagent_network = \"egress-only\"\n"), &[]).expect("the contract's name");
    assert_eq!(c.agents[DEFAULT_AGENT].network, NetworkMode::EgressOnly);
    let err = load(Some("[agents.default]\nnetwork = \"closed\"\n"), &[]).expect_err("unknown mode");
    assert!(err.to_string().contains("agents.default.network"), "{err}");
    let err = load(
        Some("[agents.default]\nnetwork = \"egress-only\"\nsandbox = \"none\"\n"),
        &[],
    )
    .expect_err("egress-only without a sandbox");
    assert!(err.to_string().contains("agents.default.network"), "{err}");
}

#[test]
fn the_metrics_token_comes_from_the_file_or_the_environment_and_is_never_empty() {
    use secrecy::ExposeSecret;
    assert!(load(None, &[]).expect("defaults").metrics_token.is_none());
    let c = load(
        Some("metrics_token = \"from-file\"\n"),
        &[("ACP_GATEWAY_METRICS_TOKEN", "from-env")],
    )
    .expect("loads");
    assert_eq!(c.metrics_token.as_ref().map(|t| t.expose_secret()), Some("from-env"));
    assert!(load(Some("metrics_token = \" \"\n"), &[]).is_err(), "empty");
}

#[test]
fn missing_file_is_an_error() {
    let cli = CliOverrides {
        config_file: Some("/nonexistent/acp.toml".into()),
        ..Default::default()
    };
    let err = Config::load_with_env(&cli, |_| None).expect_err("must fail");
    assert!(err.to_string().contains("/nonexistent/acp.toml"));
}
