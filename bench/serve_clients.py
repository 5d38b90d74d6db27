"""Real clients against a running `foxlm serve` (see serve_clients.sh): the official `openai`
package (completions, streaming, echo + logprobs, several prompts, n), and the model folder's
tokenizer.json through transformers.AutoTokenizer compared with the server's /tokenize.
Exits non-zero on any mismatch."""
import json
import sys
import urllib.request

from openai import OpenAI

base, model_dir = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base + "/v1", api_key="unused")
ok = True


def check(what, cond):
    global ok
    print(("ok   " if cond else "FAIL ") + what)
    ok &= bool(cond)


models = client.models.list()
name = models.data[0].id
print("model:", name, "| context:", models.data[0].model_extra.get("max_model_len"),
      "| text format:", models.data[0].model_extra.get("text_format"))

prompt = "Call me Ishmael. Some years ago"
r = client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0)
print("completion:", json.dumps(r.choices[0].text), "| finish:", r.choices[0].finish_reason, "| usage:", r.usage)
check("usage adds up and a 'length' finish used all 24 tokens",
      r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
      and (r.choices[0].finish_reason == "stop" or r.usage.completion_tokens == 24))

pieces = []
for chunk in client.completions.create(model=name, prompt=prompt, max_tokens=24, temperature=0, stream=True):
    if chunk.choices:
        pieces.append(chunk.choices[0].text)
check(f"streaming ({len(pieces)} chunks) equals the plain answer", "".join(pieces) == r.choices[0].text)

e = client.completions.create(model=name, prompt=prompt, max_tokens=0, temperature=0, echo=True, logprobs=3)
lp = e.choices[0].logprobs
print("echo + logprobs: tokens", lp.tokens[:6], "...")
print("  token_logprobs", [None if x is None else round(x, 3) for x in lp.token_logprobs[:6]], "...")
print("  top_logprobs[1]", {k: round(v, 3) for k, v in lp.top_logprobs[1].items()})
check("echo returns the prompt and a null first logprob", e.choices[0].text == prompt and lp.token_logprobs[0] is None)

b = client.completions.create(model=name, prompt=["It was", "The whale"], max_tokens=8, temperature=0.8, seed=5, n=2)
print("2 prompts x n=2:", [json.dumps(c.text) for c in sorted(b.choices, key=lambda c: c.index)])
b2 = client.completions.create(model=name, prompt=["It was", "The whale"], max_tokens=8, temperature=0.8, seed=5, n=2)
check("4 choices, and the same seed gives the same samples",
      len(b.choices) == 4 and [c.text for c in b.choices] == [c.text for c in b2.choices])

try:
    client.completions.create(model=name, prompt=prompt, max_tokens=10**6)
    check("max_tokens beyond the context is refused", False)
except Exception as err:  # openai.BadRequestError
    check(f"max_tokens beyond the context is refused: {type(err).__name__}: {str(err)[:90]}", "400" in str(err))


def tokenize(text):
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"prompt": text, "add_special_tokens": False}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))["tokens"]


from transformers import AutoTokenizer  # noqa: E402

tok = AutoTokenizer.from_pretrained(model_dir)
texts = [prompt, 'He said: "Whale\tho!"\nAnd then\\ silence.', "Café, naïve — “quoted” €5", "<|endoftext|>It began"]
same = [tok(t, add_special_tokens=False).input_ids == tokenize(t) for t in texts]
check(f"tokenizer.json (transformers {type(tok).__name__}) tokenizes as the server: {same}", all(same))
sys.exit(0 if ok else 1)
