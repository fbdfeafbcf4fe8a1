//! What the showcase says and writes: the `hello.rs` it edits, the `cargo test` output it shows
//! (with real ANSI colours), the Markdown answer, and how that answer is cut into chunks.

use std::fmt::Write as _;

/// How many past prompts `hello.rs` keeps.
const KEPT_PROMPTS: usize = 4;
/// Longest prompt excerpt written into `hello.rs`, in characters.
const EXCERPT_MAX: usize = 48;
/// The line that opens the prompt list in `hello.rs`.
const PROMPTS_OPEN: &str = "pub const PROMPTS: &[&str] = &[";
/// The line that starts the function the read tool call points at.
pub(super) const GREETING_FN: &str = "pub fn greeting() -> String {";

/// The revision `hello.rs` says it is (0 when it is missing or was not written by us).
pub(super) fn revision_of(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("//! Revision "))
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The 1-based line on which `needle` starts a line of `text`.
pub(super) fn line_of(text: &str, needle: &str) -> Option<u32> {
    let i = text.lines().position(|l| l.starts_with(needle))?;
    u32::try_from(i + 1).ok()
}

/// The next revision of `hello.rs`: the revision number, the model and the greeting change,
/// this prompt joins the list (the oldest drops off), so each diff is a small real one.
pub(super) fn next_hello(old: Option<&str>, prompt: &str, model: &str) -> String {
    let revision = old.map_or(0, revision_of) + 1;
    let mut prompts: Vec<&str> = old
        .into_iter()
        .flat_map(str::lines)
        .skip_while(|l| *l != PROMPTS_OPEN)
        .skip(1)
        .take_while(|l| *l != "];")
        .collect();
    let first_line = prompt
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("(empty)");
    let excerpt: String = first_line.chars().take(EXCERPT_MAX).collect();
    let entry = format!("    {excerpt:?},");
    prompts.push(&entry);
    let keep = prompts.len().saturating_sub(KEPT_PROMPTS);
    let prompts = prompts.get(keep..).unwrap_or_default().join("\n");
    format!(
        r#"//! Written by the acp-gateway demo agent; every prompt changes it a little.
//! Revision {revision}, by {model}.

/// The latest prompts, newest last.
{PROMPTS_OPEN}
{prompts}
];

/// Says hello, and which revision this is.
{GREETING_FN}
    format!("Hello from revision {revision}: {{}} prompt(s) kept", PROMPTS.len())
}}

fn main() {{
    println!("{{}}", greeting());
}}

#[cfg(test)]
mod tests {{
    #[test]
    fn greets() {{
        assert!(super::greeting().starts_with("Hello"));
    }}
}}
"#
    )
}

/// The `greeting` function of a `hello.rs` text, for the answer's code block.
pub(super) fn greeting_fn(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines().skip_while(|l| *l != GREETING_FN) {
        out.push_str(line);
        out.push('\n');
        if line == "}" {
            break;
        }
    }
    out
}

/// ANSI SGR codes, as cargo and rustc print them on a terminal.
const BOLD_GREEN: &str = "\x1b[1m\x1b[32m";
const BOLD_YELLOW: &str = "\x1b[1m\x1b[33m";
const BOLD_BLUE: &str = "\x1b[1m\x1b[94m";
const BOLD: &str = "\x1b[1m";
const GREEN: &str = "\x1b[32m";
const RED: &str = "\x1b[31m";
const YELLOW: &str = "\x1b[33m";
const RESET: &str = "\x1b[0m";

/// What `cargo test` printed, coloured: first the build part (shown while it "runs"), then
/// the whole of it. `fresh` says whether this turn's edit is on disk; when it is not, the
/// freshness test fails (red) and the exit code is 101.
pub(super) fn cargo_test(revision: u64, fresh: bool, dir: &str) -> (String, String, i32) {
    let secs = 0.31 + (revision % 7) as f64 * 0.07;
    let mut out = String::new();
    let _ = writeln!(out, "{BOLD_GREEN}   Compiling{RESET} acp-demo v0.1.{revision} ({dir})");
    let _ = writeln!(
        out,
        "{BOLD_YELLOW}warning{RESET}{BOLD}: unused variable: `started`{RESET}\n \
         {BOLD_BLUE}-->{RESET} hello.rs:14:9\n  \
         {BOLD_BLUE}|{RESET}\n\
         {BOLD_BLUE}14{RESET} {BOLD_BLUE}|{RESET}     let started = std::time::Instant::now();\n  \
         {BOLD_BLUE}|{RESET}         {BOLD_YELLOW}^^^^^^^{RESET}\n  \
         {BOLD_BLUE}|{RESET}\n\
         {BOLD}help{RESET}: if this is intentional, prefix it with an underscore\n  \
         {BOLD_BLUE}|{RESET}\n\
         {BOLD_BLUE}14{RESET} {RED}- {RESET}    let {RED}started{RESET} = std::time::Instant::now();\n\
         {BOLD_BLUE}14{RESET} {GREEN}+ {RESET}    let {GREEN}_started{RESET} = std::time::Instant::now();\n  \
         {BOLD_BLUE}|{RESET}\n"
    );
    let _ = writeln!(
        out,
        "{BOLD_GREEN}    Finished{RESET} `test` profile [unoptimized + debuginfo] target(s) in {secs:.2}s"
    );
    let building = out.clone();
    let _ = writeln!(
        out,
        "{BOLD_GREEN}     Running{RESET} unittests hello.rs (target/debug/deps/hello-{revision:08x})\n"
    );
    let _ = writeln!(out, "running 3 tests");
    let _ = writeln!(out, "test tests::greets ... {GREEN}ok{RESET}");
    let (fresh_result, verdict, code) = if fresh {
        (format!("{GREEN}ok{RESET}"), format!("{GREEN}ok{RESET}"), 0)
    } else {
        (format!("{RED}FAILED{RESET}"), format!("{RED}FAILED{RESET}"), 101)
    };
    let _ = writeln!(out, "test tests::greeting_is_fresh ... {fresh_result}");
    let _ = writeln!(out, "test tests::talks_to_the_network ... {YELLOW}ignored{RESET}\n");
    if !fresh {
        let _ = writeln!(
            out,
            "failures:\n\n---- tests::greeting_is_fresh stdout ----\n\n\
             thread 'tests::greeting_is_fresh' panicked at hello.rs:31:9:\n\
             {RED}hello.rs is still at revision {}: the edit was not applied{RESET}\n",
            revision.saturating_sub(1)
        );
    }
    let (passed, failed) = if fresh { (2, 0) } else { (1, 1) };
    let _ = writeln!(
        out,
        "test result: {verdict}. {passed} passed; {failed} failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s"
    );
    if !fresh {
        let _ = writeln!(
            out,
            "\n{BOLD}{RED}error{RESET}{BOLD}: test failed, to rerun pass `--lib`{RESET}"
        );
    }
    (building, out, code)
}

/// How one step of the turn went, for the answer's table and task list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Not part of this turn.
    Skipped,
    /// Done; the text says what came of it.
    Done(String),
    /// Refused or failed; the text says why.
    Failed(String),
}

impl Outcome {
    fn cell(&self) -> String {
        match self {
            Outcome::Skipped => "skipped".into(),
            Outcome::Done(s) => s.replace('|', "\\|"),
            Outcome::Failed(s) => format!("**failed**: {}", s.replace('|', "\\|")),
        }
    }

    fn tick(&self) -> char {
        if matches!(self, Outcome::Done(_)) { 'x' } else { ' ' }
    }
}

/// What the answer reports.
#[derive(Debug)]
pub(super) struct Facts<'a> {
    /// The model's display name ("Demo Swift").
    pub model: &'a str,
    /// The reasoning effort's display name.
    pub effort: &'a str,
    /// The mode's display name ("Code").
    pub mode: &'a str,
    /// Whether the mode is Plan (the answer is a plan).
    pub plan_mode: bool,
    /// The read step.
    pub read: Outcome,
    /// The edit step.
    pub edit: Outcome,
    /// The test step.
    pub test: Outcome,
    /// The `greeting` function as it is (or, in Plan mode, would be) after this turn.
    pub code: String,
    /// The prompt, cut to a short excerpt.
    pub echo: &'a str,
    /// At least this many characters of answer (so that many chunks are not empty).
    pub min_chars: usize,
}

/// The Markdown answer: a heading, a paragraph with bold, inline code and a link, a GFM table,
/// a GFM task list, a Rust code block and a closing line that echoes the prompt.
pub(super) fn answer(f: &Facts<'_>) -> String {
    let mut md = String::new();
    let (heading, did) = if f.plan_mode {
        (
            "A plan for `acp-demo/hello.rs`",
            "I only looked: in **Plan** mode nothing is edited or run. Switch to *Code* or *Ask* to apply it.",
        )
    } else if matches!(f.edit, Outcome::Done(_)) {
        (
            "Updated `acp-demo/hello.rs`",
            "I read the file, changed its greeting and ran `cargo test`.",
        )
    } else {
        ("About `acp-demo/hello.rs`", "Here is where things stand.")
    };
    let _ = writeln!(md, "## {heading}\n");
    let _ = writeln!(
        md,
        "**{}** answered, with *{}* reasoning effort in **{}** mode. {did} Every card above is a part of the \
         [Agent Client Protocol](https://agentclientprotocol.com): `session/update` notifications, \
         streamed as they happen.\n",
        f.model, f.effort, f.mode
    );
    let _ = writeln!(md, "| Step | Tool | Result |\n| --- | --- | --- |");
    let _ = writeln!(md, "| Read `hello.rs` | `read` | {} |", f.read.cell());
    let _ = writeln!(md, "| Change the greeting | `edit` | {} |", f.edit.cell());
    let _ = writeln!(md, "| Run `cargo test` | `execute` | {} |\n", f.test.cell());
    let _ = writeln!(md, "- [{}] Read the file", f.read.tick());
    let _ = writeln!(md, "- [{}] Change the greeting", f.edit.tick());
    let _ = writeln!(md, "- [{}] Run the tests", f.test.tick());
    let _ = writeln!(md, "- [ ] Ship it\n");
    let verb = if f.plan_mode { "would become" } else { "now reads" };
    let _ = writeln!(md, "The greeting {verb}:\n\n```rust\n{}```\n", f.code);
    let mut n = 0;
    while md.chars().count() < f.min_chars {
        if n == 0 {
            md.push_str("### More, to stream\n\n");
        }
        n += 1;
        let _ = writeln!(md, "{n}. Line {n} of a long answer, sent in many small pieces.");
    }
    if n > 0 {
        md.push('\n');
    }
    let _ = write!(md, "You said: {}", f.echo);
    md
}

/// Cuts `text` into `n` non-empty pieces (fewer if it has fewer characters) at places that
/// look arbitrary but are the same for the same `seed`: mid-word, mid-line, and, when a code
/// fence is there and `n >= 3`, inside the first fence's backticks, so a client must cope.
pub(super) fn split(text: &str, n: u64, seed: u64) -> Vec<&str> {
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let len = starts.len();
    let n = usize::try_from(n).unwrap_or(usize::MAX).clamp(1, len.max(1));
    if len == 0 {
        return vec![text];
    }
    // Cut k (1..n) sits near k*len/n, moved by up to a third of a piece either way.
    let mut rng = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let piece = len / n;
    let mut cuts: Vec<usize> = Vec::with_capacity(n);
    for k in 1..n {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let spread = piece / 3;
        let jitter = if spread == 0 {
            0
        } else {
            (rng >> 33) as usize % (2 * spread + 1)
        };
        let want = (k * len / n + jitter).saturating_sub(spread);
        let lo = cuts.last().map_or(1, |c| c + 1);
        let hi = len - (n - k);
        cuts.push(want.clamp(lo, hi));
    }
    if n >= 3
        && let Some(fence) = text.find("```").map(|b| starts.partition_point(|&s| s < b) + 2)
        && !cuts.contains(&fence)
        && fence < len
        && let Some(nearest) = (0..cuts.len()).min_by_key(|&i| cuts.get(i).map_or(usize::MAX, |c| c.abs_diff(fence)))
        && let Some(slot) = cuts.get_mut(nearest)
    {
        // No other cut lies between the nearest one and the fence, so the order holds.
        *slot = fence;
    }
    let mut pieces = Vec::with_capacity(n);
    let mut from = 0;
    for cut in cuts.into_iter().chain([len]) {
        let (a, b) = (
            starts.get(from).copied(),
            starts.get(cut).copied().unwrap_or(text.len()),
        );
        if let Some(a) = a {
            pieces.push(text.get(a..b).unwrap_or_default());
        }
        from = cut;
    }
    pieces
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hello_rs_changes_a_little_each_time() {
        let one = next_hello(None, "make it \"shine\"\nsecond line", "Demo Swift");
        assert_eq!(revision_of(&one), 1);
        assert!(one.contains(r#"    "make it \"shine\"","#), "{one}");
        assert_eq!(line_of(&one, GREETING_FN), Some(10));
        let mut text = one.clone();
        for i in 2..=6 {
            text = next_hello(Some(&text), &format!("prompt {i}"), "Demo Deep");
            assert_eq!(revision_of(&text), i);
        }
        assert!(text.contains("Hello from revision 6"));
        assert!(!text.contains("shine") && text.contains("\"prompt 6\","), "{text}");
        assert_eq!(text.matches("    \"prompt").count(), KEPT_PROMPTS);
        assert!(greeting_fn(&text).starts_with(GREETING_FN) && greeting_fn(&text).ends_with("}\n"));
        // A file someone else wrote starts over at revision 1.
        assert_eq!(revision_of(&next_hello(Some("fn main() {}"), "x", "m")), 1);
    }

    #[test]
    fn cargo_output_has_colours() {
        let (building, all, code) = cargo_test(3, true, "/w/acp-demo");
        assert_eq!(code, 0);
        assert!(all.starts_with(&building));
        assert!(all.contains("\x1b[32mok\x1b[0m") && all.contains("\x1b[31m") && all.contains("\x1b[1m"));
        assert!(all.contains("\x1b[33mignored"));
        let (_, failed, code) = cargo_test(3, false, "/w/acp-demo");
        assert_eq!(code, 101);
        assert!(failed.contains("\x1b[31mFAILED\x1b[0m"));
    }

    #[test]
    fn splits_anywhere_but_loses_nothing() {
        let text = "## Title\n\nSome **bold** words.\n\n```rust\nfn main() {}\n```\n\nYou said: hé ü";
        for n in [1, 2, 3, 7, 40, 1000] {
            let pieces = split(text, n, 5);
            assert_eq!(pieces.concat(), text, "n={n}");
            assert!(pieces.iter().all(|p| !p.is_empty()));
            assert_eq!(pieces.len() as u64, n.min(text.chars().count() as u64));
        }
        let pieces = split(text, 7, 5);
        assert!(
            pieces.iter().any(|p| p.ends_with("``") && !p.ends_with("```")),
            "{pieces:?}"
        );
        assert_eq!(split(text, 7, 5), pieces, "the same seed cuts the same way");
        assert_eq!(split("", 5, 1), vec![""]);
    }

    #[test]
    fn answer_is_real_markdown() {
        let facts = Facts {
            model: "Demo Swift",
            effort: "medium",
            mode: "Code",
            plan_mode: false,
            read: Outcome::Done("12 lines".into()),
            edit: Outcome::Done("revision 1 → 2".into()),
            test: Outcome::Failed("exit | 101".into()),
            code: "fn x() {}\n".into(),
            echo: "hi",
            min_chars: 0,
        };
        let md = answer(&facts);
        for part in [
            "## Updated",
            "**Demo Swift**",
            "`session/update`",
            "[Agent Client Protocol](https://agentclientprotocol.com)",
            "| --- | --- | --- |",
            "- [x] Read the file",
            "- [ ] Run the tests",
            "```rust\nfn x() {}\n```",
            "exit \\| 101",
        ] {
            assert!(md.contains(part), "{part} in {md}");
        }
        assert!(md.ends_with("You said: hi"));
        let long = answer(&Facts {
            min_chars: 5000,
            ..facts
        });
        assert!(long.chars().count() >= 5000 && long.ends_with("You said: hi"));
    }
}
