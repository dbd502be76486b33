"""A v1 harness that knows nothing of vfkit: one plain (non-streamed) chat completion.

Run inside the verifiers venv; a vfkit task run under it is scored from the trace's messages.
"""

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.runtimes import ProgramResult


class PlainChat(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT, EXECUTES_CODE, NEEDS_CONTAINER = True, False, False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        messages += [m.model_dump(exclude_none=True) for m in prompt]
        async with AsyncOpenAI(base_url=endpoint, api_key=secret) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return ProgramResult(0, "", "")


__all__ = ["PlainChat"]
