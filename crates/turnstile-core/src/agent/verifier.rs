//! Optional verification after each tool round.

use async_trait::async_trait;

use crate::message::ToolResult;
use crate::message::{ToolCall, VerificationReport};

/// Inspects a turn's tool calls and their results, and may add a report.
/// Reports accumulate in the loop checkpoint and survive resumes.
#[async_trait]
pub trait Verifier: Send + Sync {
    /// Looks at turn `turn`'s calls with their results; `None` adds no
    /// report.
    async fn verify(
        &self,
        turn: u32,
        calls: &[(ToolCall, ToolResult)],
    ) -> Option<VerificationReport>;
}
