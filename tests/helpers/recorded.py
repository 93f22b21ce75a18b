"""What a request the fake Messages API recorded says: the first user turn's text, the tool
results the harness sent back. (The SDK sends content as a string or as a list of blocks.)

Not here: the fake API (orchestrator/testing/fakeapi.py), starting it (conftest's fake_api).
"""

from __future__ import annotations


def as_text(content) -> str:
    """Content as text: a string as it is; of a list of blocks, their text joined."""
    return content if isinstance(content, str) else "".join(block.get("text", "") for block in content)


def first_user_text(request) -> str:
    """The first user turn's text: the context a wake opened with."""
    return as_text(request.body["messages"][0]["content"])


def result_text(block: dict) -> str:
    """A tool_result block's content as text."""
    return as_text(block["content"])


def tool_results(request) -> list[dict]:
    """The tool_result blocks of the request's last user turn."""
    return [
        block
        for block in request.body["messages"][-1]["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


def tool_result_texts(request) -> list[str]:
    return [result_text(block) for block in tool_results(request)]
