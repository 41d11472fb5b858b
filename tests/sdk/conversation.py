"""Three turns of one conversation through the openai SDK, as an
application writes them: the history re-sent each turn, no session id
(unless asked to send `prompt_cache_key`). Prints one JSON line per turn:
the gateway's routing headers and the cached tokens the engine reported."""
import json
import sys

import openai

base_url, mode = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
extra = {"prompt_cache_key": "sdk-conversation-1"} if mode == "prompt-cache-key" else None
history = [
    {"role": "system", "content": "You are a careful coding agent. " * 200},
    {"role": "user", "content": "Read src/main.rs and explain it. " * 100},
]
for turn in range(3):
    raw = client.chat.completions.with_raw_response.create(
        model="sim-model", messages=history, max_tokens=4, extra_body=extra
    )
    reply = raw.parse()
    details = reply.usage.prompt_tokens_details
    print(json.dumps({
        "peer": raw.headers.get("x-routed-peer"),
        "session": raw.headers.get("x-routed-session"),
        "source": raw.headers.get("x-routed-source"),
        "cached": (details.cached_tokens if details else 0) or 0,
    }), flush=True)
    history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    history.append({"role": "user", "content": f"Now change step {turn}. " * 100})
