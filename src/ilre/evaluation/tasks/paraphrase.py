"""The paraphrased-key needle (task niah_paraphrase): the question names a thing by one word, the needle
by a synonym, and the needle's wording shares no other word with the question either.

RULER's needles repeat the question's rare words ("special magic number for <key>"), which is
what lets a lexical retriever (BM25) find them; here nothing but meaning links the two, as in vt.
"""

from __future__ import annotations

import random
import re

# (the question's word, the needle's synonym): no word of one appears in the other
PAIRS = (
    ("automobile", "motor car"), ("physician", "medical doctor"), ("attorney", "lawyer"), ("couch", "sofa"),
    ("rabbit", "bunny"), ("jail", "prison"), ("forest", "woodland"), ("boulder", "huge rock"),
    ("pupil", "schoolchild"), ("wealth", "riches"), ("garbage", "rubbish"), ("autumn", "fall season"),
    ("stomach", "belly"), ("residence", "dwelling"), ("journey", "voyage"), ("sorcerer", "wizard"),
    ("beverage", "drink"), ("cemetery", "graveyard"), ("chef", "cook"), ("kitten", "young cat"),
    ("puppy", "young dog"), ("mountain", "tall peak"), ("carpet", "rug"), ("present", "gift"),
    ("photograph", "picture"), ("infant", "newborn baby"), ("ocean", "open sea"), ("bicycle", "pushbike"),
    ("lantern", "lamp"), ("scholar", "academic"), ("thief", "robber"), ("monarch", "king"),
)
NEEDLE = "The {synonym} keeps a secret code, and that code reads {value}."
STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to was were what which with "
    "all any about above below some".split())


def pick_pair(rng: random.Random) -> tuple[str, str]:
    """(question word, needle synonym) drawn with rng."""
    return rng.choice(PAIRS)


def needle(synonym: str, value: str) -> str:
    """The paraphrased needle sentence."""
    return NEEDLE.format(synonym=synonym, value=value)


def rare_words(text: str) -> set[str]:
    """Lower-case words of `text` that are not stopwords (digits and one-letter words left out)."""
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 1 and w not in STOPWORDS}
