"""An agent on any OpenAI-compatible chat-completions endpoint: a local vLLM, Ollama or LM Studio
server, or a hosted one (OpenAI itself by default).

    OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_MODEL=llama3.2 agentlog serve --app app:app

Where requests go comes from the environment: `OPENAI_BASE_URL` (default OpenAI's
https://api.openai.com/v1), `OPENAI_API_KEY` (a local server takes none), `OPENAI_MODEL` (the
model name the server serves). Without the environment, give them in code instead:

    OpenAIChatModel("llama3.2", base_url="http://127.0.0.1:11434/v1", api_key=None)
"""

from __future__ import annotations

import os

from agentlog import AgentSpec, App, tool

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers exactly (models are bad at arithmetic)."""
    return a * b


app = App(
    agents=[AgentSpec(
        id="assistant",
        description="Answers questions; multiplies with a tool.",
        # `openai:<name>`: Chat Completions at $OPENAI_BASE_URL, key from $OPENAI_API_KEY
        model=f"openai:{MODEL}",
        tools=["multiply"],
        system_prompt="You are a concise assistant. Use the multiply tool for any multiplication.",
        max_rounds=4,
    )],
    tools=[multiply],
)
