//! `tools`: the tools an agent of these flags has (the command line's own
//! and those of the `--mcp-stdio` and `--mcp-http` servers), with what each MCP tool
//! declares about itself, whether its calls wait for approval, and what a
//! recovery does with a call a crash left in doubt.

use std::io::Write;

use clap::Args;
use serde::Serialize;

use super::approvals::ApprovalArgs;
use super::exit::CliError;
use super::mcp::{self, McpArgs};
use super::ops::columns;
use super::output::{self, Style};
use super::tools::toolbox;

#[derive(Args, Debug)]
pub struct ToolsArgs {
    #[command(flatten)]
    pub approval: ApprovalArgs,
    #[command(flatten)]
    pub mcp: McpArgs,
}

/// One tool, as `--json` prints it.
#[derive(Serialize)]
struct Listed {
    name: String,
    /// `builtin`, or the MCP server it comes from.
    source: String,
    description: String,
    /// What an MCP tool declares (`readOnlyHint` …); `null` when it says
    /// nothing, and for the built-in tools.
    read_only: Option<bool>,
    destructive: Option<bool>,
    idempotent: Option<bool>,
    open_world: Option<bool>,
    requires_approval: bool,
    /// What a recovery does with a call a crash left in doubt: `reconcile`
    /// (the server is asked), `retry` (it runs again), `ambiguous` (the
    /// default policy refuses).
    in_doubt: InDoubt,
}

#[derive(Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
enum InDoubt {
    Reconcile,
    Retry,
    Ambiguous,
}

impl InDoubt {
    fn of(reconciles: bool, retries: bool) -> Self {
        match (reconciles, retries) {
            (true, _) => InDoubt::Reconcile,
            (false, true) => InDoubt::Retry,
            (false, false) => InDoubt::Ambiguous,
        }
    }

    fn shown(self) -> &'static str {
        match self {
            InDoubt::Reconcile => "reconcile",
            InDoubt::Retry => "retry",
            InDoubt::Ambiguous => "ambiguous",
        }
    }
}

pub(super) async fn run(
    args: ToolsArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = args.approval.tools()?;
    let servers = args.mcp.connect().await?;
    let mut listed: Vec<Listed> = toolbox()
        .iter()
        .map(|tool| {
            let spec = tool.spec();
            Listed {
                requires_approval: approval.contains(&spec.name),
                in_doubt: InDoubt::of(false, tool.idempotent()),
                name: spec.name,
                source: "builtin".into(),
                description: spec.description,
                read_only: None,
                destructive: None,
                idempotent: None,
                open_world: None,
            }
        })
        .collect();
    let policy = mcp::policy();
    for server in &servers {
        let taken: Vec<String> = listed.iter().map(|t| t.name.clone()).collect();
        let exposed = server
            .exposed(&taken)
            .map_err(|e| CliError::Usage(e.to_string()))?;
        listed.extend(exposed.into_iter().map(|(name, tool)| Listed {
            name,
            source: server.name().to_owned(),
            description: tool.description.clone(),
            read_only: tool.annotations.read_only,
            destructive: tool.annotations.destructive,
            idempotent: tool.annotations.idempotent,
            open_world: tool.annotations.open_world,
            requires_approval: policy.requires_approval(&tool.name, &tool.annotations),
            in_doubt: InDoubt::of(
                server.reconciles(),
                policy.retries_in_doubt(&tool.name, &tool.annotations),
            ),
        }));
    }
    if json {
        return output::json(out, &serde_json::json!({ "tools": listed }));
    }
    let hint = |value: Option<bool>| match value {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    };
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|tool| {
            vec![
                output::plain(&tool.name).into_owned(),
                output::plain(&tool.source).into_owned(),
                hint(tool.read_only).into(),
                hint(tool.destructive).into(),
                hint(tool.idempotent).into(),
                hint(tool.open_world).into(),
                match tool.requires_approval {
                    true => "asks".into(),
                    false => "runs".into(),
                },
                tool.in_doubt.shown().into(),
            ]
        })
        .collect();
    columns(
        out,
        &[
            &style.bold("TOOL"),
            "SOURCE",
            "READ-ONLY",
            "DESTRUCTIVE",
            "IDEMPOTENT",
            "OPEN-WORLD",
            "APPROVAL",
            "IN DOUBT",
        ],
        &rows,
    )
}
