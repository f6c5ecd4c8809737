#!/usr/bin/env python3
"""The MCP server turnstile-mcp's tests run, on the official `mcp` package 2.3.0.

Transport:
    python server.py [--effects PATH] [--reconcile]   -> stdio (default)
    python server.py --http PORT [--token T]  -> streamable HTTP on http://127.0.0.1:PORT/mcp,
                                               every request needing `Authorization: Bearer T`

Every tool call appends one line to the file named by --effects PATH (or
$MCP_EFFECTS_LOG):
    "<tool> <idempotency key or -> <args json>"
The idempotency key is read from the request's `_meta["turnstile/idempotency-key"]`
(exposed to tools as `ctx.request_context.meta`). The line is written when the
call starts, before the tool's effect (so `sleep` is logged even if killed).

Tools with the annotations asked for:
    lookup(key)              readOnlyHint=true
    delete_file(path, hold, crash) destructiveHint=true; holds `hold` seconds after its
                             effect, or with `crash` kills the server right after it
    set_flag(name, value, hold) idempotentHint=true, destructiveHint=false; holds likewise
    snapshot()               image content (1x1 PNG, base64) + structuredContent {"width":1,"height":1}
    sleep(seconds)           sleeps, then returns
    fail(message)            returns isError=true
    bundle()                 text + embedded text and blob resources + resource_link content items
    crash(code)              kills the server process mid-call (os._exit), no response
    grow()                   adds the read-only tool `extra` and removes `sleep`, then sends
                             notifications/tools/list_changed

With --reconcile it also offers turnstile's reconcile convention:
    turnstile_reconcile(tool, idempotency_key, arguments)
        structuredContent {"status": "done"} with the call's answer as content when
        the effects log holds a call of `tool` with that key, {"status": "not_done"}
        otherwise (delete_file and set_flag only; "unknown" for other tools).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    BlobResourceContents,
    TextResourceContents,
    ToolAnnotations,
)

IDEMPOTENCY_META_KEY = "turnstile/idempotency-key"

# 1x1 transparent PNG.
PNG_1X1_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)

mcp = MCPServer(name="turnstile-test-server", version="0.1.0", log_level="WARNING")

def _idempotency_key(ctx: Context) -> str | None:
    meta = ctx.request_context.meta  # RequestParamsMeta (a dict) or None
    if not meta:
        return None
    value = meta.get(IDEMPOTENCY_META_KEY)
    return None if value is None else str(value)


EFFECTS_LOG = os.environ.get("MCP_EFFECTS_LOG")


def _record(tool: str, ctx: Context, args: dict[str, Any]) -> None:
    path = EFFECTS_LOG
    if not path:
        return
    key = _idempotency_key(ctx) or "-"
    line = f"{tool} {key} {json.dumps(args, sort_keys=True, separators=(',', ':'))}\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


@mcp.tool(description="Look up a value by key.", annotations=ToolAnnotations(read_only_hint=True))
def lookup(key: str, ctx: Context) -> str:
    _record("lookup", ctx, {"key": key})
    return f"value-of-{key}"


def _deleted(path: str) -> str:
    return f"deleted {path}"


def _flag_set(name: str, value: bool) -> str:
    return f"flag {name}={str(value).lower()}"


@mcp.tool(description="Delete a file (pretend).", annotations=ToolAnnotations(destructive_hint=True))
async def delete_file(path: str, ctx: Context, hold: float = 0, crash: bool = False) -> str:
    _record("delete_file", ctx, {"path": path})
    if crash:
        os._exit(3)
    await asyncio.sleep(hold)
    return _deleted(path)


@mcp.tool(
    description="Set a named flag.",
    annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False),
)
async def set_flag(name: str, value: bool, ctx: Context, hold: float = 0) -> str:
    _record("set_flag", ctx, {"name": name, "value": value})
    await asyncio.sleep(hold)
    return _flag_set(name, value)


def turnstile_reconcile(tool: str, idempotency_key: str, arguments: dict[str, Any]) -> CallToolResult:
    """Did the call of `tool` with this idempotency key take effect?"""
    answers = {
        "delete_file": lambda: _deleted(arguments.get("path", "")),
        "set_flag": lambda: _flag_set(arguments.get("name", ""), bool(arguments.get("value"))),
    }
    if tool not in answers:
        return CallToolResult(content=[], structured_content={"status": "unknown"})
    done = False
    if EFFECTS_LOG and os.path.exists(EFFECTS_LOG):
        with open(EFFECTS_LOG, encoding="utf-8") as f:
            done = any(line.split(" ", 2)[:2] == [tool, idempotency_key] for line in f)
    if not done:
        return CallToolResult(content=[], structured_content={"status": "not_done"})
    return CallToolResult(
        content=[TextContent(type="text", text=answers[tool]())],
        structured_content={"status": "done"},
    )


@mcp.tool(description="Return a 1x1 PNG plus its size as structured content.")
def snapshot(ctx: Context) -> CallToolResult:
    _record("snapshot", ctx, {})
    return CallToolResult(
        content=[ImageContent(type="image", data=PNG_1X1_B64, mime_type="image/png")],
        structured_content={"width": 1, "height": 1},
    )


@mcp.tool(description="Sleep for N seconds, then return.")
async def sleep(seconds: float, ctx: Context) -> str:
    _record("sleep", ctx, {"seconds": seconds})
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@mcp.tool(description="Always fails with isError=true.")
def fail(ctx: Context, message: str = "requested failure") -> CallToolResult:
    _record("fail", ctx, {"message": message})
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


@mcp.tool(description="Return text, an embedded resource and a resource link.")
def bundle(ctx: Context) -> CallToolResult:
    _record("bundle", ctx, {})
    return CallToolResult(
        content=[
            TextContent(type="text", text="bundle"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(uri="file:///tmp/note.txt", mime_type="text/plain", text="hello"),
            ),
            EmbeddedResource(
                type="resource",
                resource=BlobResourceContents(uri="file:///tmp/b.bin", mime_type="application/octet-stream", blob="AQID"),
            ),
            ResourceLink(type="resource_link", uri="file:///tmp/big.bin", name="big.bin", mime_type="application/octet-stream"),
        ]
    )


def extra(ctx: Context) -> str:
    _record("extra", ctx, {})
    return "extra"


@mcp.tool(description="Add the tool `extra` and say the tools changed.")
async def grow(ctx: Context) -> str:
    _record("grow", ctx, {})
    if all(tool.name != "extra" for tool in await mcp.list_tools()):
        mcp.add_tool(extra, description="Added by grow.", annotations=ToolAnnotations(read_only_hint=True))
        mcp.remove_tool("sleep")
    await ctx.session.send_tool_list_changed()
    return "grown"


@mcp.tool(description="Kill the server process mid-call (no response is sent).")
def crash(ctx: Context, code: int = 3) -> str:
    _record("crash", ctx, {"code": code})
    sys.stdout.flush()
    os._exit(code)


def _bearer(app: Any, token: str) -> Any:
    """`app`, answering 401 to an HTTP request without `Authorization: Bearer <token>`."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    parser.add_argument("--effects", metavar="PATH", help="the file each call is recorded in")
    parser.add_argument("--reconcile", action="store_true", help="offer turnstile_reconcile")
    parser.add_argument("--token", help="over HTTP, the bearer token every request needs")
    args = parser.parse_args()
    if args.reconcile:
        mcp.add_tool(
            turnstile_reconcile,
            description="turnstile's reconcile convention.",
            annotations=ToolAnnotations(read_only_hint=True),
        )
    if args.effects:
        global EFFECTS_LOG
        EFFECTS_LOG = args.effects
    if args.http is not None:
        import uvicorn

        import socket

        app = mcp.streamable_http_app()
        if args.token:
            app = _bearer(app, args.token)
        # Bound here, so the line below tells the test the port is this
        # process's (a bind that fails exits before it).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", args.http))
        print("LISTENING", flush=True)
        config = uvicorn.Config(app, log_level="warning")
        uvicorn.Server(config).run(sockets=[sock])
    else:
        mcp.run("stdio")


if __name__ == "__main__":
    main()
