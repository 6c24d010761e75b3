"""The demo's MCP server (official `mcp` SDK, stdio): `python -m agentlog.cli.demo_mcp`.

One tool, `release_notes(release)`, that reports MCP progress while it "collects" the notes.
`agentlog demo` starts it as a subprocess and its agent calls it as `mcp__notes__release_notes`
(an ordinary tool to the loop: recorded in the log, progress on the live channel).
"""

from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("agentlog-demo-notes")
CHANGES = ["faster cold resume", "MCP tools", "context compaction"]


@server.tool()
async def release_notes(release: str, ctx: Context) -> dict[str, object]:
    """The release notes of a release."""
    for i, change in enumerate(CHANGES, 1):
        await ctx.report_progress(i, len(CHANGES), change)
    return {"release": release, "changes": CHANGES}


if __name__ == "__main__":
    server.run()
