"""A v1 harness that asks for one streamed chat completion (run inside the verifiers venv).

verifiers' eval client streams from the model server only when the harness's own request to the
interception endpoint has `stream: true` (`verifiers/v1/interception/server.py`: `relay =
streaming and not TrainClientConfig`); vfkit's harness calls without it, and verifiers' own
streaming harnesses (`null`, `bash`) need `uv` to install their program. This one streams with
the openai SDK and knows nothing of vfkit, so the vfkit task scores the trace's messages.
"""

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.runtimes import ProgramResult


class StreamingChat(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT, EXECUTES_CODE, NEEDS_CONTAINER = True, False, False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        messages += [m.model_dump(exclude_none=True) for m in prompt]
        async with AsyncOpenAI(base_url=endpoint, api_key=secret) as client:
            stream = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                          stream=True)
            async for _chunk in stream:
                pass
        return ProgramResult(0, "", "")


__all__ = ["StreamingChat"]
