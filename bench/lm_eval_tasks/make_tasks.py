"""Builds the three small lm-evaluation-harness tasks of bench/serve_clients.sh from the Moby-Dick
sample in the repository (deterministic; the .jsonl files it writes are checked in).

foxlm_cloze.jsonl: multiple choice. A sentence's first words are the context; its true ending and
three endings of other sentences are the choices.
foxlm_ppl.jsonl: paragraphs for a perplexity (loglikelihood_rolling) task.
foxlm_next_word.jsonl: generation (generate_until). A sentence's first words are the context, the
word after them the answer (chapters of their own, 100-119, so no item is another task's).
"""
import json
import random
import re
from pathlib import Path

here = Path(__file__).resolve().parent
book = here.parent.parent / "data" / "sample" / "moby-dick"


def shuffled_sentences(chapters, rng):
    """The chapters' sentences of 60-160 characters without quotes, shuffled by `rng`."""
    text = "\n".join((book / f"chapter_{i}.txt").read_text() for i in chapters)
    found = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text.replace("\n", " "))]
    found = [s for s in found if 60 <= len(s) <= 160 and '"' not in s]
    rng.shuffle(found)
    return found


rng = random.Random(12)
sentences = shuffled_sentences(range(120, 136), rng)
items = []
for s in sentences[:40]:
    words = s.split(" ")
    cut = max(3, int(len(words) * 0.6))
    context, ending = " ".join(words[:cut]), " " + " ".join(words[cut:])
    others = []
    for o in sentences[40:]:
        ow = o.split(" ")
        e = " " + " ".join(ow[max(3, int(len(ow) * 0.6)):])
        if e != ending and e not in others:
            others.append(e)
        if len(others) == 3:
            break
    sentences = sentences[:40] + sentences[44:]  # use fresh distractors next time
    choices = others + [ending]
    rng.shuffle(choices)
    items.append({"context": context, "choices": choices, "label": choices.index(ending)})
with open(here / "foxlm_cloze.jsonl", "w") as f:
    for it in items:
        f.write(json.dumps(it) + "\n")

paras = [p.strip() for p in (book / "chapter_133.txt").read_text().split("\n\n") if len(p.strip()) > 200]
with open(here / "foxlm_ppl.jsonl", "w") as f:
    for p in paras[:8]:
        f.write(json.dumps({"text": p}) + "\n")
# Generation: sentences of chapters 100-119, cut where the next word is a plain word.
words_items = []
for s in shuffled_sentences(range(100, 120), random.Random(13)):
    words = s.split(" ")
    cut = max(3, int(len(words) * 0.6))
    word = re.sub(r"[^A-Za-z'-]", "", words[cut]) if cut < len(words) else ""
    if re.fullmatch(r"[A-Za-z][A-Za-z'-]*", word or "-"):
        words_items.append({"context": " ".join(words[:cut]), "word": word})
    if len(words_items) == 40:
        break
with open(here / "foxlm_next_word.jsonl", "w") as f:
    for it in words_items:
        f.write(json.dumps(it) + "\n")
print(len(items), "cloze items,", min(8, len(paras)), "paragraphs,", len(words_items), "next-word items")
