"""A text with known structure, for the language-model tests and `make bench --cases muon`.

Sentences of a small grammar: every word a fixed spelling, every choice random. A model that
learnt the text sits well below its characters' unigram entropy and near their bigram one.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from itertools import pairwise


def grammar_text(sentences: int, seed: int = 0) -> str:
    """`sentences` sentences of the grammar, drawn with `seed`."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my old friend", "the teacher", "every child", "our queen"]
    verbs = ["sees", "likes", "chases", "paints", "forgets", "carries"]
    objects = ["the moon", "a red ball", "his garden", "the river", "some bread", "a letter"]
    endings = [".\n", "!\n", " today.\n", " again.\n"]
    return "".join(
        f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(endings)}"
        for _ in range(sentences)
    )


def unigram_entropy(text: str) -> float:
    """Nats per character of the best model that ignores context: the characters' frequencies."""
    counts = Counter(text)
    return -sum(c / len(text) * math.log(c / len(text)) for c in counts.values())


def bigram_entropy(text: str) -> float:
    """Nats per character of the best model that sees one character back (a bigram table)."""
    pairs, firsts = Counter(pairwise(text)), Counter(text[:-1])
    n = len(text) - 1
    return -sum(c / n * math.log(c / firsts[a]) for (a, _), c in pairs.items())
