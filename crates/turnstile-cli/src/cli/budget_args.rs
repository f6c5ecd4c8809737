//! The budget options of `run`, `resume`, `recover` and `recover-expired`:
//! the request's limits, stored with it when `run` admits it. A continuing
//! command runs under the stored limits; each limit it is given replaces
//! the stored one from then on (the new run records the change).

use clap::Args;

use turnstile::agent::Budget;
use turnstile::BudgetKind;

/// The turns a new request may take when `run` is given no `--max-turns`.
pub const DEFAULT_MAX_TURNS: u32 = 32;

#[derive(Args, Clone, Copy, Debug, Default)]
pub struct BudgetArgs {
    /// The most turns (model calls) the request may take over all its runs.
    /// `run` stores it with the request (default 32); on a continuing
    /// command it raises (or lowers) the stored limit.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_turns: Option<u32>,
    /// The most tool calls the request may make over all its runs (default:
    /// no limit).
    #[arg(long, value_name = "N")]
    pub max_tool_calls: Option<u64>,
    /// The most input plus output tokens the request may spend over all its
    /// runs (default: no limit).
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
}

impl BudgetArgs {
    /// The budget `run` stores with a new request.
    pub(crate) fn for_new_request(self) -> Budget {
        Budget {
            max_turns: Some(self.max_turns.unwrap_or(DEFAULT_MAX_TURNS)),
            ..self.as_given()
        }
    }

    /// The limits given, to replace the stored ones of a continued request.
    pub(crate) fn as_given(self) -> Budget {
        Budget {
            max_turns: self.max_turns,
            max_tokens: self.max_tokens,
            max_tool_calls: self.max_tool_calls,
        }
    }
}

/// The option that raises a spent budget of `kind`, and a value past
/// `limit` to give it (twice the limit: enough to see progress, not
/// unbounded); `None` for a kind this command has no option for.
pub(crate) fn raise(kind: BudgetKind, limit: u64) -> Option<(&'static str, u64)> {
    let flag = match kind {
        BudgetKind::Turns => "--max-turns",
        BudgetKind::Tokens => "--max-tokens",
        BudgetKind::ToolCalls => "--max-tool-calls",
        _ => return None,
    };
    let raised = limit.saturating_mul(2).max(limit.saturating_add(1));
    let raised = match kind {
        BudgetKind::Turns => raised.min(u64::from(u32::MAX)),
        _ => raised,
    };
    Some((flag, raised))
}
