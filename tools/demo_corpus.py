"""The demo model's text: the fortune cookies of Debian's `fortunes` package and the byte-level
BPE tokenizer learnt from them, written as the tokenizer.json that pdserve (src/model/tokenizer*)
and Hugging Face's tokenizers read. Used by tools/train_demo_model.py; needs only the standard
library.
"""

import heapq
import json
import os
import re

CORPUS_DIR = "/usr/share/games/fortunes"
CORPUS_LICENSE = "/usr/share/doc/fortunes/copyright"
SKIPPED_FILES = {"art", "ascii-art"}  # pictures, not text

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"]
BOS, EOT = "<|begin_of_text|>", "<|eot_id|>"
# Llama-3's chat template: pdserve recognises it and renders it natively (src/model/chat_template.cc).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
CHAT_PROMPTS = ["Tell me a fortune.", "Give me a fortune cookie.", "Say something wise.",
                "Tell me something funny.", "What does my fortune say?", "Any words of wisdom?",
                "Cheer me up.", "Tell me a joke."]
CHAT_FRACTION = 1 / 3

# Llama-3's split regex (tokenizer.json's Split pre-tokenizer) in Python's `re`: \p{L} is
# [^\W\d_] and \p{N} is \d, the same on the corpus (ASCII but for a few characters).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PY_SPLIT = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\w\r\n]|_)?[^\W\d_]+|\d{1,3}|"
                      r" ?(?:[^\w\s]|_)+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# ---------------------------------------------------------------------------------------------
# Corpus

def read_fortunes(corpus_dir):
    """Every fortune of the corpus, in file order (files sorted by name)."""
    fortunes = []
    for name in sorted(os.listdir(corpus_dir)):
        path = os.path.join(corpus_dir, name)
        if name in SKIPPED_FILES or "." in name or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for entry in re.split(r"^%\n", text, flags=re.M):
            entry = entry.rstrip()
            if entry and not re.search(r"[\x00-\x08\x0b-\x1f\x7f\ufffd]", entry):
                fortunes.append(entry)
    return fortunes


# ---------------------------------------------------------------------------------------------
# Byte-level BPE (GPT-2's byte alphabet), as tokenizer.json and pdserve's tokenizer read it

def byte_alphabet():
    """byte -> the printable character that stands for it in tokenizer.json (GPT-2's table)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    table, extra = {}, 0x100
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(extra)
            extra += 1
    return table


BYTE_CHARS = byte_alphabet()
CHAR_BYTES = {c: b for b, c in BYTE_CHARS.items()}


def to_byte_chars(data):
    return "".join(BYTE_CHARS[b] for b in data)


def pretokenize(text):
    """The words pdserve's Split pre-tokenizer cuts `text` into (matches and the gaps between)."""
    words, pos = [], 0
    for m in PY_SPLIT.finditer(text):
        if m.start() > pos:
            words.append(text[pos:m.start()])
        if m.end() > m.start():
            words.append(m.group())
        pos = m.end()
    if pos < len(text):
        words.append(text[pos:])
    return words


def train_bpe(word_counts, num_tokens):
    """Classic BPE on {word bytes: count}: merges the most frequent adjacent pair (ties to the
    smallest token bytes) until the vocabulary has `num_tokens` tokens. Returns (tokens as bytes
    by id, merges as (left id, right id) in rank order)."""
    tokens = [bytes([b]) for b in range(256)]
    token_ids = {t: i for i, t in enumerate(tokens)}
    words = [list(w) for w in word_counts]
    counts = list(word_counts.values())
    pair_count, pair_words = {}, {}
    for wi, w in enumerate(words):
        for pair in zip(w, w[1:]):
            pair_count[pair] = pair_count.get(pair, 0) + counts[wi]
            pair_words.setdefault(pair, set()).add(wi)
    heap = [(-c, tokens[p[0]], tokens[p[1]], p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(tokens) < num_tokens and heap:
        neg, _, _, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or -neg < 2:
            continue  # stale entry (the count has changed since) or nothing left worth merging
        merged = tokens[pair[0]] + tokens[pair[1]]
        if merged not in token_ids:
            token_ids[merged] = len(tokens)
            tokens.append(merged)
        new_id = token_ids[merged]
        merges.append(pair)
        changed = set()
        for wi in sorted(pair_words.pop(pair)):
            w, c = words[wi], counts[wi]
            for p in zip(w, w[1:]):
                pair_count[p] -= c
                changed.add(p)
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == pair:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for p in zip(out, out[1:]):
                pair_count[p] = pair_count.get(p, 0) + c
                pair_words.setdefault(p, set()).add(wi)
                changed.add(p)
        pair_count.pop(pair, None)
        for p in changed:
            if pair_count.get(p, 0) > 0 and p != pair:
                heapq.heappush(heap, (-pair_count[p], tokens[p[0]], tokens[p[1]], p))
    return tokens, merges


class Tokenizer:
    """Encodes as pdserve does: special tokens cut out first, then the Split pre-tokenizer, then
    BPE merges by (rank, position) within each word."""

    def __init__(self, tokens, merges, specials):
        self.tokens = tokens  # bytes by id (the byte-level model tokens)
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {}
        for rank, (l, r) in enumerate(merges):
            self.ranks[(l, r)] = (rank, self.ids[tokens[l] + tokens[r]])  # a repeat keeps the last
        self.merges = merges
        self.special_ids = {s: len(tokens) + i for i, s in enumerate(specials)}
        self.specials = specials
        self.special_re = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")
        self.cache = {}

    @classmethod
    def from_folder(cls, folder):
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        vocab = tj["model"]["vocab"]
        tokens = [None] * len(vocab)
        for s, i in vocab.items():
            tokens[i] = bytes(CHAR_BYTES[c] for c in s)
        by_string = {to_byte_chars(t): i for i, t in enumerate(tokens)}
        merges = [tuple(by_string[x] for x in m.split(" ")) for m in tj["model"]["merges"]]
        specials = [t["content"] for t in sorted(tj["added_tokens"], key=lambda t: t["id"])]
        return cls(tokens, merges, specials)

    @property
    def vocab_size(self):
        return len(self.tokens) + len(self.specials)

    def encode_word(self, word):
        ids = self.cache.get(word)
        if ids is not None:
            return ids
        ids = list(word.encode("utf-8"))
        while len(ids) > 1:
            best = None
            for i in range(len(ids) - 1):
                rule = self.ranks.get((ids[i], ids[i + 1]))
                if rule is not None and (best is None or rule[0] < best[0]):
                    best = (rule[0], i, rule[1])
            if best is None:
                break
            ids[best[1]:best[1] + 2] = [best[2]]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        ids = []
        for part in self.special_re.split(text):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
            elif part:
                for word in pretokenize(part):
                    ids.extend(self.encode_word(word))
        return ids

    def decode(self, ids):
        return b"".join(self.tokens[i] if i < len(self.tokens) else b"" for i in ids).decode(
            "utf-8", errors="replace")

    def tokenizer_json(self):
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                      "use_regex": False}
        return {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": self.special_ids[s], "content": s, "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False,
                              "special": True} for s in self.specials],
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_SPLIT}, "behavior": "Isolated",
                 "invert": False}, byte_level]},
            "post_processor": byte_level, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {to_byte_chars(t): i for i, t in enumerate(self.tokens)},
                      "merges": [to_byte_chars(self.tokens[l]) + " " +
                                 to_byte_chars(self.tokens[r]) for l, r in self.merges]},
        }


def chat_text(user, answer):
    """Llama-3's template rendered for one user turn and the assistant's answer."""
    return (f"{BOS}<|start_header_id|>user<|end_header_id|>\n\n{user.strip()}{EOT}"
            f"<|start_header_id|>assistant<|end_header_id|>\n\n{answer.strip()}{EOT}")
