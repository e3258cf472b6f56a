#!/usr/bin/env python3
"""Checks an OpenAI-compatible server with the official `openai` client.

Usage: .ci/openai_check.py [URL]     (default: $OPENAI_CHECK_URL, else
                                      http://127.0.0.1:8080)

URL is the server's base (`http://HOST:PORT`; `/v1` is added). The API key
is $OPENAI_API_KEY (any value where the server asks for none).

Checks, each printed as `ok` or `FAIL` with the reason:
  models       GET /v1/models lists at least one model (its id is used below)
  chat         a chat completion: content, finish_reason, usage
  chat-stream  a streamed chat completion with stream_options.include_usage
               and ignore_eos: content arrives in chunks, and a usage chunk
               with completion_tokens == max_tokens
  completion   a completion (/v1/completions) with ignore_eos: text,
               finish_reason "length", usage
  bad-request  a chat completion with max_tokens=-2 is refused with HTTP 400
               (openai.BadRequestError), as OpenAI, vLLM and llama-server do.
               Not -1, which llama-server reads as "no limit"; not an empty
               `messages` list, an unknown role or an unknown model, which
               llama-server accepts.

Exit status 0 when every check passes, 1 otherwise. .ci/openai_check.sh
starts a server and runs this against it.
"""

import os
import sys
import traceback

import openai

MAX_TOKENS = 8


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OPENAI_CHECK_URL", "http://127.0.0.1:8080")
    base = url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    client = openai.OpenAI(
        base_url=base,
        api_key=os.environ.get("OPENAI_API_KEY") or "no-key",
        timeout=120.0,
        max_retries=0,
    )
    state = {"model": None}
    failures = []

    def check(name, fn):
        try:
            detail = fn()
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures.append(name)
            print(f"FAIL  {name}: {type(e).__name__}: {e}")
            if os.environ.get("OPENAI_CHECK_VERBOSE"):
                traceback.print_exc()
            return
        print(f"ok    {name}{': ' + detail if detail else ''}")

    def expect(cond, what):
        if not cond:
            raise AssertionError(what)

    def models():
        listing = client.models.list()
        ids = [m.id for m in listing.data]
        expect(ids, "no model listed")
        state["model"] = ids[0]
        return f"{len(ids)} model(s), first {ids[0]!r}"

    def model():
        return state["model"] or "default"

    def chat():
        r = client.chat.completions.create(
            model=model(),
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        expect(r.object == "chat.completion", f"object is {r.object!r}")
        expect(len(r.choices) == 1, f"{len(r.choices)} choices")
        c = r.choices[0]
        expect(c.message.role == "assistant", f"role is {c.message.role!r}")
        expect(isinstance(c.message.content, str), "no content")
        expect(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}")
        expect(r.usage is not None, "no usage")
        expect(r.usage.prompt_tokens > 0, f"prompt_tokens {r.usage.prompt_tokens}")
        expect(0 <= r.usage.completion_tokens <= MAX_TOKENS, f"completion_tokens {r.usage.completion_tokens}")
        return f"{c.message.content!r} ({r.usage.completion_tokens} tokens, {c.finish_reason})"

    def chat_stream():
        stream = client.chat.completions.create(
            model=model(),
            messages=[{"role": "user", "content": "Count from one to ten."}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, content_chunks, usage = "", 0, None
        for chunk in stream:
            expect(chunk.object == "chat.completion.chunk", f"object is {chunk.object!r}")
            if chunk.usage is not None:
                expect(usage is None, "more than one usage chunk")
                usage = chunk.usage
            for ch in chunk.choices:
                if ch.delta and ch.delta.content:
                    text += ch.delta.content
                    content_chunks += 1
        expect(content_chunks > 0, "no content chunk")
        expect(usage is not None, "no usage chunk (stream_options.include_usage)")
        expect(
            usage.completion_tokens == MAX_TOKENS,
            f"completion_tokens {usage.completion_tokens}, expected {MAX_TOKENS} (ignore_eos)",
        )
        expect(usage.prompt_tokens > 0, f"prompt_tokens {usage.prompt_tokens}")
        return f"{content_chunks} content chunks, usage {usage.prompt_tokens}+{usage.completion_tokens} tokens"

    def completion():
        r = client.completions.create(
            model=model(),
            prompt="The capital of France is",
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        expect(r.object == "text_completion", f"object is {r.object!r}")
        expect(len(r.choices) == 1, f"{len(r.choices)} choices")
        c = r.choices[0]
        expect(isinstance(c.text, str) and c.text, "no text")
        expect(c.finish_reason == "length", f"finish_reason {c.finish_reason!r}")
        expect(r.usage is not None and r.usage.completion_tokens == MAX_TOKENS, f"usage {r.usage}")
        return f"{c.text!r}"

    def bad_request():
        try:
            client.chat.completions.create(
                model=model(), messages=[{"role": "user", "content": "hi"}], max_tokens=-2
            )
        except openai.BadRequestError as e:
            return f"HTTP {e.status_code}"
        raise AssertionError("max_tokens=-2 was accepted")

    check("models", models)
    check("chat", chat)
    check("chat-stream", chat_stream)
    check("completion", completion)
    check("bad-request", bad_request)
    if failures:
        print(f"{len(failures)} of 5 checks failed: {', '.join(failures)}")
        return 1
    print("all 5 checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
