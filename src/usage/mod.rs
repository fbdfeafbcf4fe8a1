//! What each person spends. Agents report a session's cumulative cost in `usage_update` (an ACP
//! stable update); the gateway turns each report into the day's increase for that user, agent and
//! currency (`store::usage`), shows each user their own days and admins everyone's, and with
//! `[usage]` caps refuses the next `session/prompt` of someone past their daily or monthly cap
//! with an error that names the cap and when it resets.
//!
//! [`Usage::observe`] runs on the update path: it only reads the update when its text names
//! `usage_update`, and queues the sample (bounded; a full queue drops it, with a warning) for one
//! writer task, which records samples in order. Days are UTC; the clock can be set (tests).

pub mod quota;
mod store;

use parking_lot::RwLock;
use std::sync::Arc;

use chrono::{DateTime, Datelike, Duration as Days, NaiveDate, Utc};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::infra::config::UsageConfig;
use crate::protocol::RpcError;
pub use store::{UsageLog, UsageRow, UsageSample};

/// JSON-RPC code of a refusal at a cost cap (in the implementation-defined `-32000` range).
pub use crate::protocol::codes::COST_CAP_REACHED;
/// Samples queued for the store, at most.
const QUEUE: usize = 4096;

/// A clock (UTC).
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// Spending: the recorder and the caps.
pub struct Usage {
    tx: mpsc::Sender<UsageSample>,
    store: UsageLog,
    cfg: UsageConfig,
    clock: RwLock<Clock>,
}

impl std::fmt::Debug for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Usage").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

impl Usage {
    /// The recorder and its writer task (which drains what is queued when `stop` fires).
    pub fn spawn(
        store: UsageLog,
        cfg: UsageConfig,
        stop: CancellationToken,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        #[expect(
            clippy::disallowed_methods,
            reason = "returned: the application awaits it at shutdown"
        )]
        let task = tokio::spawn(write(store.clone(), rx, stop));
        let clock: Clock = Arc::new(Utc::now);
        let usage = Arc::new(Self {
            tx,
            store,
            cfg,
            clock: RwLock::new(clock),
        });
        (usage, task)
    }

    /// Sets the clock (tests: a day boundary without waiting for one).
    pub fn set_clock(&self, clock: Clock) {
        *self.clock.write() = clock;
    }

    fn now(&self) -> DateTime<Utc> {
        (self.clock.read())()
    }

    /// Takes note of an update of `owner`'s session: a `usage_update` with a cost is recorded.
    pub fn observe(&self, owner: &str, agent: &str, session: &str, update: &str) {
        if !update.contains("\"usage_update\"") {
            return;
        }
        #[derive(serde::Deserialize)]
        struct Cost {
            amount: f64,
            currency: String,
        }
        #[derive(serde::Deserialize)]
        struct Update {
            #[serde(rename = "sessionUpdate")]
            kind: String,
            cost: Option<Cost>,
        }
        let Ok(Update { kind, cost: Some(cost) }) = serde_json::from_str::<Update>(update) else {
            return;
        };
        if kind != "usage_update" || !cost.amount.is_finite() || cost.currency.len() > 16 {
            return;
        }
        let sample = UsageSample {
            owner: owner.to_string(),
            agent: agent.to_string(),
            session: session.to_string(),
            day: day_of(self.now().date_naive()),
            currency: cost.currency,
            cumulative: cost.amount,
        };
        if self.tx.try_send(sample).is_err() {
            tracing::warn!(user = %owner, "a usage report was dropped: the usage queue is full");
        }
    }

    /// `owner`'s days from the first of this month on.
    pub async fn this_month(&self, owner: Option<&str>) -> Result<Vec<UsageRow>, RpcError> {
        let today = self.now().date_naive();
        Ok(self.store.days(owner, &day_of(first_of_month(today))).await?)
    }

    /// Whether `owner` may start a prompt: `Err` naming the cap and when it resets when they have
    /// spent their daily or monthly cap.
    pub async fn check(&self, owner: &str) -> Result<(), RpcError> {
        let today = self.now().date_naive();
        let currency = &self.cfg.currency;
        let caps = [
            ("daily", self.cfg.daily_cost_cap, today, today + Days::days(1)),
            (
                "monthly",
                self.cfg.monthly_cost_cap,
                first_of_month(today),
                next_month(today),
            ),
        ];
        for (name, cap, since, resets) in caps {
            let Some(cap) = cap else { continue };
            let spent = self.store.cost_since(owner, &day_of(since), currency).await?;
            if spent >= cap {
                let resets_at = format!("{}T00:00:00Z", day_of(resets));
                return Err(RpcError::new(
                    COST_CAP_REACHED,
                    format!(
                        "{name} cost cap reached: you have spent {spent:.2} {currency} of {cap:.2} {currency}; it resets at {resets_at}"
                    ),
                )
                .with_data(serde_json::json!({
                    "cap": format!("{name}_cost"), "limit": cap, "spent": spent, "currency": currency, "resetsAt": resets_at,
                })));
            }
        }
        Ok(())
    }
}

/// Records samples in order until `stop`, then what is left.
async fn write(store: UsageLog, mut rx: mpsc::Receiver<UsageSample>, stop: CancellationToken) {
    loop {
        let sample = tokio::select! {
            s = rx.recv() => match s { Some(s) => s, None => return },
            () = stop.cancelled() => {
                while let Ok(s) = rx.try_recv() {
                    record(&store, &s).await;
                }
                return;
            }
        };
        record(&store, &sample).await;
    }
}

async fn record(store: &UsageLog, s: &UsageSample) {
    if let Err(e) = store.record(s).await {
        tracing::warn!(user = %s.owner, error = %e, "cannot record a usage report");
    }
}

fn day_of(d: NaiveDate) -> String {
    d.format("%Y-%m-%d").to_string()
}

fn first_of_month(d: NaiveDate) -> NaiveDate {
    d.with_day(1).unwrap_or(d)
}

fn next_month(d: NaiveDate) -> NaiveDate {
    let (y, m) = if d.month() == 12 {
        (d.year() + 1, 1)
    } else {
        (d.year(), d.month() + 1)
    };
    NaiveDate::from_ymd_opt(y, m, 1).unwrap_or(d)
}

impl crate::session::UpdateObserver for Usage {
    fn update(&self, owner: &str, agent: &str, session: &str, update: &str) {
        self.observe(owner, agent, session, update);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_roll_over() {
        let d = NaiveDate::from_ymd_opt(2026, 12, 31).expect("date");
        assert_eq!(day_of(first_of_month(d)), "2026-12-01");
        assert_eq!(day_of(next_month(d)), "2027-01-01");
    }
}
