//! Placeholder: replaced by the throwaway-server harness.
pub async fn fresh_database() -> String {
    std::env::var("DATABASE_URL").expect("DATABASE_URL")
}
