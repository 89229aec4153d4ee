#!/usr/bin/env python3
"""Golden data of the text encoders, issue 54 (deterministic, seed 0).

Run with the developer venv (torch, transformers, tokenizers, sentence-transformers,
easy-vqa), no network:

    .venv-dev/bin/python python/golden/make_golden_text.py

It rewrites, and touches nothing else of golden/:

- golden/text/corpus.txt: the small multilingual corpus (English, French,
  German, Spanish with accents, Chinese, Japanese, emoji, numbers and
  punctuation) the tokenizers are trained on, composed here.
- golden/models/tiny-bert, tiny-bert-mlm, tiny-minilm, tiny-xlmr,
  tiny-modernbert, tiny-bert-massive, tiny-modernbert-massive (the last two
  with massive activations planted in the [SEP] token, `make_massive`):
  tiny random checkpoints of transformers' own classes
  (`save_pretrained`, safetensors, bf16, odd sizes), each with its tokenizer
  (`tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`)
  trained here with the `tokenizers` library: WordPiece (uncased for
  tiny-bert and tiny-minilm, cased for tiny-bert-mlm), an XLM-R style Unigram
  and a ModernBERT style byte-level BPE. tiny-minilm has the
  sentence-transformers layout of all-MiniLM-L6-v2 (modules.json,
  sentence_bert_config.json, 1_Pooling/config.json: mean pooling, then
  Normalize).
- golden/text/texts.jsonl: the golden texts, `{"name", "text"}` a line.
- golden/text/tokens/<model>.json: transformers' fast tokenizer, loaded
  from the model directory, on every text at every max_length in
  MAX_LENGTHS: `tokenizer(text, truncation=True, max_length=L)`.
- golden/text/tower/<model>/<text>-<L>.safetensors: the model reloaded from
  disk in fp32 (eager attention) on the tokenizer's ids of one text
  truncated to L tokens, unpadded: `input_ids` and `token_type_ids` (int64,
  [T]), `last_hidden_state` [T, D], `pooler_output` [1, D] where the model
  has a pooler, `sentence_embedding` [1, D] (tiny-minilm, computed by
  sentence-transformers).
- golden/task-text/texts.jsonl: the text task gate's labelled texts (every
  distinct easy-vqa question, split train / test, labelled with its answer
  kind and the colour or shape it names).
- golden/README-text.md: what was made, with the measurements.
"""

from __future__ import annotations

import os

# The tokenizers' trainers run on one thread so that ties resolve the same way every run;
# nothing here may reach the network.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import sentence_transformers  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from easy_vqa import get_test_questions, get_train_questions  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    ModernBertConfig,
    ModernBertModel,
    XLMRobertaConfig,
    XLMRobertaModel,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_golden import save_file  # noqa: E402  (the byte-deterministic writer)

SEED = 0
ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "golden"
TEXT = GOLDEN / "text"
MAX_LENGTHS = [16, 128, 512]
TOWER_LENGTHS = [16, 128]
TOWER_TEXTS = ["empty", "plain", "accents", "cjk-emoji", "medium", "long"]
LONG_512 = ["tiny-bert", "tiny-modernbert"]  # the long text at 512 tokens too, for these models

# Tokenizers: kind, training vocabulary size and the pipeline (see make_tokenizer).
TOKENIZERS = {
    "wordpiece-uncased": dict(vocab=1000, lowercase=True),
    "wordpiece-cased": dict(vocab=1200, lowercase=False),
    "unigram": dict(vocab=900),
    "bytelevel-bpe": dict(vocab=800),
}

MODELS = {
    "tiny-bert": dict(
        cls="BertModel", tokenizer="wordpiece-uncased",
        config=dict(hidden_size=60, num_attention_heads=3, intermediate_size=90, num_hidden_layers=3,
                    type_vocab_size=2, hidden_act="gelu", max_position_embeddings=520, layer_norm_eps=1e-12)),
    "tiny-bert-mlm": dict(
        cls="BertForMaskedLM", tokenizer="wordpiece-cased",
        config=dict(hidden_size=44, num_attention_heads=4, intermediate_size=70, num_hidden_layers=2,
                    type_vocab_size=2, hidden_act="gelu_new", max_position_embeddings=528, layer_norm_eps=1e-12)),
    "tiny-minilm": dict(
        cls="BertModel", tokenizer="wordpiece-uncased", sentence_transformers=True,
        config=dict(hidden_size=52, num_attention_heads=4, intermediate_size=100, num_hidden_layers=3,
                    type_vocab_size=2, hidden_act="gelu", max_position_embeddings=520, layer_norm_eps=1e-12)),
    "tiny-xlmr": dict(
        cls="XLMRobertaModel", tokenizer="unigram",
        config=dict(hidden_size=56, num_attention_heads=4, intermediate_size=88, num_hidden_layers=3,
                    type_vocab_size=1, hidden_act="gelu", max_position_embeddings=522, layer_norm_eps=1e-5,
                    pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    "tiny-modernbert": dict(
        cls="ModernBertModel", tokenizer="bytelevel-bpe",
        config=dict(hidden_size=60, num_attention_heads=3, intermediate_size=90, num_hidden_layers=4,
                    hidden_activation="gelu", max_position_embeddings=1024, local_attention=8,
                    global_attn_every_n_layers=2, norm_eps=1e-5)),
    # Massive activations planted in the [SEP] token (`make_massive`): the residual remedy's goldens.
    "tiny-bert-massive": dict(
        cls="BertModel", tokenizer="wordpiece-uncased", massive=True,
        config=dict(hidden_size=44, num_attention_heads=4, intermediate_size=70, num_hidden_layers=2,
                    type_vocab_size=2, hidden_act="gelu", max_position_embeddings=520, layer_norm_eps=1e-12)),
    "tiny-modernbert-massive": dict(
        cls="ModernBertModel", tokenizer="bytelevel-bpe", massive=True,
        config=dict(hidden_size=48, num_attention_heads=4, intermediate_size=70, num_hidden_layers=3,
                    hidden_activation="gelu", max_position_embeddings=1024, local_attention=8,
                    global_attn_every_n_layers=2, norm_eps=1e-5, mlp_bias=True)),
}
#: The massive models' channels and what block 0's MLP writes into them in the [SEP] token (`make_massive`).
MASSIVE_CHANNELS, MASSIVE_BOOST = [5, 17], 100000.0
MASSIVE_TEXTS = ["plain", "cjk-emoji", "medium"]  # their tower cases, at 128 tokens
CLASSES = {"BertModel": BertModel, "BertForMaskedLM": BertForMaskedLM, "XLMRobertaModel": XLMRobertaModel,
           "ModernBertModel": ModernBertModel}
CONFIGS = {"BertModel": BertConfig, "BertForMaskedLM": BertConfig, "XLMRobertaModel": XLMRobertaConfig,
           "ModernBertModel": ModernBertConfig}
ST_MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's sentence_bert_config.json


# --------------------------------------------------------------------------
# the corpus and the texts
# --------------------------------------------------------------------------

EN = [
    "The quick brown fox jumps over the lazy dog.",
    "A small model runs on the Neural Engine beside the chat.",
    "Retrieval needs an embedding of every document and of the query.",
    "What color is the triangle in the top left corner?",
    "Is there a red circle in the image? No, there is a blue rectangle.",
    "She sells sea shells by the sea shore, doesn't she?",
    "The router picks a tool before the assistant answers.",
    "Tokenization splits text into words, then words into pieces.",
    "We measured 14.0 ms at 128 tokens and 100.6 ms at 512.",
    "Numbers like 3.14159, 2.71828 and 1,000,000 appear in reports.",
    "Email me at someone@example.com or call +1 (555) 010-9999.",
    "It's 12:30pm on 2024-05-17; the meeting moved to room B-204.",
    "Don't panic! Everything is fine... probably.",
    "Prices rose by 7% in March, 12% in April and 0.5% in May.",
    "The encoder reads the whole sentence at once, in both directions.",
    "Attention masks hide the padding tokens from every query.",
    "Green, yellow, teal, brown, gray, black: the easy shapes have eight colors.",
    "Unbelievable! Unaffordable! Unremarkable! Undeniably uncommon.",
    "Photosynthesis converts light into chemical energy.",
    "The library opens at nine and closes at five on weekdays.",
]
FR = [
    "Café déjà vu : le garçon a commandé une crème brûlée.",
    "L'hôtel est à côté de la forêt, près du château.",
    "Où est la bibliothèque ? Elle est fermée aujourd'hui.",
    "Noël approche ; les enfants préparent des cadeaux.",
    "Ça coûte 12,50 € et c'est déjà payé.",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "Une naïve idée : être élève à l'école élémentaire.",
]
DE = [
    "Die Größe des Zimmers ist für uns völlig ausreichend.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "Grüße aus München! Das Wetter ist schön, aber kühl.",
    "Die Straße führt über die Brücke zum Bahnhof.",
    "Fußball ist ein Spiel mit elf Spielern pro Mannschaft.",
    "Ärger, Öl und Übung beginnen mit einem Umlaut.",
]
ES = [
    "El señor Muñoz vive en una pequeña casa en Málaga.",
    "¿Dónde está la estación? ¡Está allí, a la derecha!",
    "La niña comió piña y jamón en el jardín.",
    "Mañana habrá reunión a las diez en punto.",
    "El pingüino camina despacio sobre el hielo.",
]
ZH = [
    "北京是中国的首都。",
    "我喜欢喝茶，也喜欢看书。",
    "今天天气很好，我们去公园散步吧。",
    "这个模型很小，但是速度很快。",
    "机器学习需要大量的数据。",
    "你好，世界！",
]
JA = [
    "東京は日本の首都です。",
    "今日はいい天気ですね。",
    "ありがとうございます、とても美味しいです。",
    "東京タワーに行きたいです。",
    "カタカナとひらがなと漢字を使います。",
    "こんにちは、世界！",
]
EMOJI = [
    "I love pizza 🍕 and tacos 🌮!",
    "Good morning ☀️ have a nice day 😊",
    "Launch in 3… 2… 1… 🚀🚀🚀",
    "Thumbs up 👍 thumbs down 👎 party 🎉",
    "Robots 🤖 and cats 🐱 and dogs 🐶",
    "Hearts ❤️💙💚 and stars ⭐✨",
    "Family 👨‍👩‍👧 and flags 🇫🇷 🇩🇪 🇯🇵",
    "Coffee ☕ then tea 🍵 then sleep 😴",
]
WORDS = ("shape color circle rectangle triangle image token model text encoder query answer router tool "
         "embedding vector cosine bucket padding mask layer head attention window position sentence word piece "
         "morning evening river mountain city garden window kitchen music story number").split()


def make_corpus() -> list[str]:
    """Every fixed sentence, then seeded recombinations of them and of the word list (with numbers and
    punctuation), so that the trainers see each language and symbol many times: 330 lines."""
    rng = random.Random(SEED)
    fixed = EN + FR + DE + ES + ZH + JA + EMOJI
    lines = list(fixed)
    while len(lines) < 330:
        k = rng.randrange(4)
        if k == 0:
            lines.append(" ".join(rng.sample(fixed, 2)))
        elif k == 1:
            words = rng.sample(WORDS, rng.randint(4, 9))
            words[0] = words[0].capitalize()
            lines.append(" ".join(words) + rng.choice([".", "?", "!", ";", ":", "..."]))
        elif k == 2:
            lines.append(f"{rng.choice(WORDS)} #{rng.randint(0, 9999)}: {rng.uniform(-100, 100):.2f} "
                         f"({rng.randint(1, 99)}%) {rng.choice(EMOJI).split()[-1]}")
        else:
            lines.append(rng.choice(ZH + JA) + " " + rng.choice(EN))
    return lines


def long_text() -> str:
    rng = random.Random(SEED + 1)
    pool = EN + FR + DE + ES
    return " ".join(rng.choice(pool) for _ in range(70))


TEXTS = [
    ("plain", "The quick brown fox jumps over the lazy dog."),
    ("question", "what color is the triangle?"),
    ("accents", "Café déjà vu: naïve Größe, señor Muñoz à l'hôtel."),
    ("cjk", "東京は日本の首都です。北京是中国的首都。"),
    ("emoji", "I love pizza 🍕🍕 and 🤖 robots! 👍🏽 👨‍👩‍👧"),
    ("cjk-emoji", "東京タワー🗼に行きたいです😊 我喜欢喝茶🍵"),
    ("mixed-scripts", "Hello 世界, bonjour le monde, Привет мир, 안녕하세요 123.45 €"),
    ("numbers-punct", "Call +1 (555) 010-9999 before 12:30pm; it's 3.14159 × 2 = 6.28!!!"),
    ("combining", "cafe\u0301 vs café, ﬁne vs fine, Ｆｕｌｌ ｗｉｄｔｈ"),
    ("zero-width", "zero\u200bwidth, soft\u00adhyphen and a\u0007bell"),
    ("special-tokens", "a [MASK] b <mask> c [CLS] d [SEP] e <s> f </s>"),
    ("empty", ""),
    ("whitespace", "   \t\n  "),
    ("spaces-around", "   leading and trailing spaces   "),
    ("inner-whitespace", "several    spaces\tand\ttabs\nand\n\nlines"),
    ("uppercase", "SHOUTING IN CAPITALS AND MiXeD CaSe WoRdS"),
    ("medium", "Local assistants run auxiliary encoders beside generation: a prompt router that picks a route "
               "or tool, and an embedding model for retrieval. Le modèle est petit, mais très rapide. Die "
               "Größe ist klein. 東京は日本の首都です。 The router ran 2.9x faster 🚀."),
    ("long", long_text()),
]


# --------------------------------------------------------------------------
# tokenizers
# --------------------------------------------------------------------------

def train_wordpiece(tok: Tokenizer, corpus: list[str], size: int, specials: list[str]) -> dict[str, int]:
    """A WordPiece vocabulary as the `tokenizers` library's WordPieceTrainer makes it (BPE merges of
    the corpus's words, continuation pieces prefixed `##`, the most frequent pair first), with ties
    broken by the pair's text: the library's trainer numbers the `##` pieces in hash-map order and
    breaks ties by those numbers, so its vocabulary differs from run to run."""
    counts: dict[str, int] = {}
    for line in corpus:
        for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(line)):
            counts[w] = counts.get(w, 0) + 1
    words = {w: [w[0]] + ["##" + c for c in w[1:]] for w in counts}
    vocab = specials + sorted({p for pieces in words.values() for p in pieces})
    seen = set(vocab)
    while len(vocab) < size:
        pairs: dict[tuple[str, str], int] = {}
        for w, pieces in words.items():
            for pair in zip(pieces, pieces[1:]):
                pairs[pair] = pairs.get(pair, 0) + counts[w]
        if not pairs:
            break
        a, b = min(pairs, key=lambda p: (-pairs[p], p))
        merged = a + b[2:]
        for w, pieces in words.items():
            i, out = 0, []
            while i < len(pieces):
                if i + 1 < len(pieces) and pieces[i] == a and pieces[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(pieces[i])
                    i += 1
            words[w] = out
        if merged not in seen:
            vocab.append(merged)
            seen.add(merged)
    return {p: i for i, p in enumerate(vocab)}


def canonical_unigram(tok: Tokenizer) -> models.Unigram:
    """The trained Unigram model made the same every run: the library's trainer gives the characters it
    must keep but did not learn (the tail, below a gap of about 1 in the scores) scores min - 1 - k 1e-4
    in hash-set order, and leaves differences of ~1e-14 in the other scores. Here the tail's pieces
    take the tail's scores in the order of their text, every score is rounded to 1e-6, and the pieces
    (after the special tokens) are ordered by score, then text."""
    vocab = json.loads(tok.to_str())["model"]["vocab"]
    n = 4  # <s> <pad> </s> <unk>
    rest = sorted(((p, s) for p, s in vocab[n:]), key=lambda x: -x[1])
    gaps = [rest[i][1] - rest[i + 1][1] for i in range(len(rest) - 1)]
    cut = int(np.argmax(gaps)) + 1
    assert gaps[cut - 1] > 0.5, "no tail of required characters"
    tail = sorted(p for p, _ in rest[cut:])
    rest = rest[:cut] + list(zip(tail, [s for _, s in rest[cut:]]))
    rest = sorted(((p, round(s, 6)) for p, s in rest), key=lambda x: (-x[1], x[0]))
    return models.Unigram([tuple(v) for v in vocab[:n]] + rest, unk_id=3, byte_fallback=False)


def make_tokenizer(kind: str, corpus: list[str]) -> tuple[Tokenizer, dict, dict]:
    """Train one tokenizer on the corpus; return it with its tokenizer_config.json and
    special_tokens_map.json. Each pipeline is the one transformers 5's tokenizer class of that
    tokenizer_class rebuilds on loading (BertTokenizer and XLMRobertaTokenizer keep only the vocabulary
    and the post-processor of tokenizer.json), so that tokenizer.json alone gives transformers' ids."""
    t = TOKENIZERS[kind]
    if kind.startswith("wordpiece"):
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                    lowercase=t["lowercase"])
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        tok.model = models.WordPiece(train_wordpiece(tok, corpus, t["vocab"], specials), unk_token="[UNK]",
                                     continuing_subword_prefix="##", max_input_chars_per_word=100)
        tok.add_special_tokens(specials)  # matched in the raw text, before normalisation, as BERT's
        cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
        smap = dict(cls_token="[CLS]", mask_token="[MASK]", pad_token="[PAD]", sep_token="[SEP]", unk_token="[UNK]")
        config = dict(tokenizer_class="BertTokenizer", do_lower_case=t["lowercase"], strip_accents=None,
                      tokenize_chinese_chars=True, model_max_length=512, clean_up_tokenization_spaces=True) | smap
        return tok, config, smap
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        tok.train_from_iterator(corpus, trainers.UnigramTrainer(
            vocab_size=t["vocab"], special_tokens=["<s>", "<pad>", "</s>", "<unk>"], unk_token="<unk>",
            shrinking_factor=0.75, n_sub_iterations=2))
        tok.model = canonical_unigram(tok)
        tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
        tok.add_special_tokens(["<mask>"])  # last, as XLM-R's 250001
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
        smap = dict(bos_token="<s>", cls_token="<s>", eos_token="</s>", mask_token="<mask>", pad_token="<pad>",
                    sep_token="</s>", unk_token="<unk>")
        config = dict(tokenizer_class="XLMRobertaTokenizer", model_max_length=512,
                      clean_up_tokenization_spaces=True) | smap
        return tok, config, smap
    # ModernBERT: byte-level BPE (GPT-NeoX / OLMo style), its special tokens after the merges' vocabulary
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=t["vocab"], special_tokens=["<|endoftext|>", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # [MASK] eats the space before it, as in ModernBERT's tokenizer.json
    tok.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]", AddedToken("[MASK]", lstrip=True, special=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    smap = dict(cls_token="[CLS]", mask_token="[MASK]", pad_token="[PAD]", sep_token="[SEP]", unk_token="[UNK]")
    config = dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=1024,
                  model_input_names=["input_ids", "attention_mask"], clean_up_tokenization_spaces=True) | smap
    return tok, config, smap


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def make_tokenizers(corpus: list[str]) -> dict[str, Path]:
    """Train each tokenizer once into a scratch directory; the models copy its files."""
    out = {}
    for kind in TOKENIZERS:
        tok, config, smap = make_tokenizer(kind, corpus)
        d = TEXT / ".tokenizers" / kind
        d.mkdir(parents=True, exist_ok=True)
        tok.save(str(d / "tokenizer.json"))
        write_json(d / "tokenizer_config.json", config)
        write_json(d / "special_tokens_map.json", smap)
        out[kind] = d
        print(f"  tokenizer {kind}: {tok.get_vocab_size()} tokens")
    return out


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------

def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter gets a seeded random value, none trivially 0 or 1 (as make_golden_encoders.py):
    norm weights 1 + 0.1 N(0,1), biases 0.05 N(0,1), embedding tables 0.5 N(0,1), linear weights
    N(0, s), s = clamp(1/sqrt(fan_in), 0.05, 0.1). The padding rows are random too: the mask, not a
    zero row, keeps padding out."""
    g = torch.Generator().manual_seed(SEED * 1000 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif "embeddings" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                s = min(max(p.shape[1] ** -0.5, 0.05), 0.1)
                p.copy_(s * torch.randn(p.shape, generator=g))


def make_massive(model: torch.nn.Module, tok, channels: list[int], boost: float) -> dict:
    """Massive activations in the [SEP] token, as trained encoders show them
    in delimiter tokens (and as make_golden_encoders.py plants them in one
    patch token): `channels` of the [SEP] word embedding row hold 30, so that
    they dominate that token after the embedding norm (weight 1, bias 0
    there) and after block 0's norm before the MLP (BERT: the attention's
    post-norm; ModernBERT: mlp_norm; weight 1, bias 0 there); block 0's
    hidden unit 0 reads them with weight 10 and bias -50, which fires in that
    token alone (ModernBERT: the GeGLU's `in` half, its gate a constant 1),
    and the MLP's output projection writes `boost` into the channels through
    it: the unit is measured on the massive texts at 128 tokens (its mean
    in the [SEP] token) and the projection's weight set to `boost` over it.
    BERT: the sum the block's output LayerNorm reads passes fp16's range
    (the stream after it is normalised); ModernBERT: the residual stream
    itself, from block 0 on. Returns what was measured."""
    sep = tok.sep_token_id
    bert = isinstance(model, BertModel)
    with torch.no_grad():
        if bert:
            word, norms = model.embeddings.word_embeddings, [model.embeddings.LayerNorm,
                                                             model.encoder.layer[0].attention.output.LayerNorm]
            up, down = model.encoder.layer[0].intermediate.dense, model.encoder.layer[0].output.dense
        else:
            word, norms = model.embeddings.tok_embeddings, [model.embeddings.norm, model.layers[0].mlp_norm]
            up, down = model.layers[0].mlp.Wi, model.layers[0].mlp.Wo
        for c in channels:
            word.weight[sep, c] = 30.0
            for n in norms:
                n.weight[c] = 1.0
                if n.bias is not None:
                    n.bias[c] = 0.0
        up.weight[0].zero_()
        up.bias[0] = -50.0
        for c in channels:
            up.weight[0, c] = 10.0
        if not bert:  # the gate half: a constant 1
            inter = model.config.intermediate_size
            up.weight[inter].zero_()
            up.bias[inter] = 1.0
        down.weight[:, 0] = 0.0
        seen = []
        hook = down.register_forward_pre_hook(lambda _m, a: seen.append(a[0][0, :, 0].clone()))
        hot, rest = [], []
        for tname in MASSIVE_TEXTS:
            ids = torch.tensor(tok(dict(TEXTS)[tname], truncation=True, max_length=128)["input_ids"])
            model(input_ids=ids[None])
            hot.append(seen[-1][ids == sep])
            rest.append(seen[-1][ids != sep])
        hook.remove()
        hot, rest = torch.cat(hot), torch.cat(rest)
        assert float(hot.min()) > 1.0 and float(rest.abs().max()) < 1e-3 * float(hot.min()), (hot, rest.abs().max())
        for c in channels:
            down.weight[c, 0] = boost / float(hot.mean())
    return dict(hot=float(hot.mean()), rest=float(rest.abs().max()))


def model_config(name: str, tok_dir: Path):
    m = MODELS[name]
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    n = tok.get_vocab_size()
    c = dict(m["config"])
    if m["cls"] == "ModernBertModel":
        # ModernBERT's table is padded past the tokenizer (50368 rows for 50285 tokens): to 64 here.
        c |= dict(vocab_size=-(-n // 64) * 64, pad_token_id=tok.token_to_id("[PAD]"),
                  cls_token_id=tok.token_to_id("[CLS]"), sep_token_id=tok.token_to_id("[SEP]"),
                  bos_token_id=tok.token_to_id("[CLS]"), eos_token_id=tok.token_to_id("[SEP]"))
    elif m["cls"] == "XLMRobertaModel":
        c |= dict(vocab_size=n)
    else:
        c |= dict(vocab_size=n, pad_token_id=tok.token_to_id("[PAD]"))
    return CONFIGS[m["cls"]](**c)


def write_sentence_transformers(out: Path, dim: int) -> None:
    """The layout of sentence-transformers/all-MiniLM-L6-v2: Transformer, mean Pooling, Normalize."""
    write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
    write_json(out / "sentence_bert_config.json", {"max_seq_length": ST_MAX_SEQ_LENGTH, "do_lower_case": False})
    write_json(out / "config_sentence_transformers.json", {
        "__version__": {"sentence_transformers": "2.0.0", "transformers": "4.6.1", "pytorch": "1.8.1"}})
    (out / "1_Pooling").mkdir()
    write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": dim, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False})


def make_models(tok_dirs: dict[str, Path]) -> None:
    for k, (name, m) in enumerate(MODELS.items()):
        out = GOLDEN / "models" / name
        shutil.rmtree(out, ignore_errors=True)
        torch.manual_seed(SEED)
        cfg = model_config(name, tok_dirs[m["tokenizer"]])
        model = CLASSES[m["cls"]](cfg)
        randomise(model, k)
        if m.get("massive"):
            tok = AutoTokenizer.from_pretrained(tok_dirs[m["tokenizer"]])
            got = make_massive(model.eval(), tok, MASSIVE_CHANNELS, MASSIVE_BOOST)
            print(f"  model {name}: massive unit {got['hot']:.3f} in [SEP], elsewhere at most {got['rest']:.2g}")
        model.to(torch.bfloat16).save_pretrained(out)
        for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
            shutil.copyfile(tok_dirs[m["tokenizer"]] / f, out / f)
        if m.get("sentence_transformers"):
            write_sentence_transformers(out, cfg.hidden_size)
        keys = sorted(model.state_dict())
        print(f"  model {name}: {sum(p.numel() for p in model.parameters())} parameters, "
              f"tensors {keys[0]} .. {keys[-1]}")


# --------------------------------------------------------------------------
# golden token ids
# --------------------------------------------------------------------------

def encode(tok, text: str, max_length: int | None) -> dict[str, list[int]]:
    kw = dict(truncation=True, max_length=max_length) if max_length else {}
    return {k: list(v) for k, v in tok(text, **kw).items()}


def make_tokens() -> dict[str, dict[str, int]]:
    """transformers' ids for every text and max_length; each is checked against the tokenizers library
    reading tokenizer.json alone (as the Rust host does), and the lengths returned for the README."""
    out = TEXT / "tokens"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    lengths: dict[str, dict[str, int]] = {}
    for name, m in MODELS.items():
        d = GOLDEN / "models" / name
        tok = AutoTokenizer.from_pretrained(d)
        assert tok.is_fast, name
        raw = Tokenizer.from_file(str(d / "tokenizer.json"))
        cases, lengths[name] = [], {}
        for tname, text in TEXTS:
            full = encode(tok, text, None)
            lengths[name][tname] = len(full["input_ids"])
            for L in MAX_LENGTHS:
                e = encode(tok, text, L)
                raw.enable_truncation(L)
                r = raw.encode(text)
                assert e["input_ids"] == r.ids and e["attention_mask"] == r.attention_mask, (name, tname, L)
                if "token_type_ids" in e:
                    assert e["token_type_ids"] == r.type_ids, (name, tname, L)
                cases.append({"name": tname, "max_length": L, "length": len(full["input_ids"])} | e)
                if len(full["input_ids"]) > L:  # truncation keeps the closing special token
                    assert len(e["input_ids"]) == L and e["input_ids"][-1] == full["input_ids"][-1], (name, tname)
        # what README-text.md says of empty and blank texts
        assert lengths[name]["empty"] == 2, name
        assert (lengths[name]["whitespace"] == 2) == (m["tokenizer"] != "bytelevel-bpe"), name
        header = {"model": name, "tokenizer": m["tokenizer"], "tokenizer_class": type(tok).__name__,
                  "call": "tokenizer(text, truncation=True, max_length=max_length)", "max_lengths": MAX_LENGTHS,
                  "returns": list(cases[0])[3:]}
        body = ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases)
        head = json.dumps(header, ensure_ascii=False)[:-1]
        (out / f"{name}.json").write_text(f'{head}, "cases": [\n{body}\n]}}\n')
        print(f"  tokens {name}: {type(tok).__name__}, returns {header['returns']}")
    return lengths


# --------------------------------------------------------------------------
# reference outputs
# --------------------------------------------------------------------------

def encoder(model):
    """The tower: BertForMaskedLM's `bert` (no pooler), the model itself otherwise."""
    return getattr(model, "bert", model)


def run(model, ids, types, mask=None):
    kw = {"input_ids": ids, "attention_mask": mask if mask is not None else torch.ones_like(ids)}
    if types is not None:
        kw["token_type_ids"] = types
    return encoder(model)(**kw, output_hidden_states=True)


def padding_check(model, ids, types, pad_id: int, L: int, want: torch.Tensor) -> tuple[float, float]:
    """The same ids padded to L: the largest |difference| of the real tokens' states from the unpadded
    run, with the mask (should be ~0) and without it (the pad rows leak in: why the mask matters)."""
    T = ids.shape[1]
    pid = torch.cat([ids, torch.full((1, L - T), pad_id)], 1)
    ptypes = None if types is None else torch.cat([types, torch.zeros(1, L - T, dtype=types.dtype)], 1)
    mask = torch.cat([torch.ones(1, T, dtype=torch.int64), torch.zeros(1, L - T, dtype=torch.int64)], 1)
    with torch.no_grad():
        masked = run(model, pid, ptypes, mask).last_hidden_state[0, :T]
        unmasked = run(model, pid, ptypes).last_hidden_state[0, :T]
    return float((masked - want).abs().max()), float((unmasked - want).abs().max())


def norm_inputs_peak(model, ids, types):
    """(run(model, ids, types), the largest |input| of the blocks' and the final LayerNorms): what they read, the residual
    sums x + f(x) of a post-norm BERT (its hidden states are those sums normalised), the residual stream
    of a pre-norm ModernBERT. The embedding norm, which reads the embedding rows, is left out."""
    peaks = []
    hooks = [mod.register_forward_pre_hook(lambda _m, a: peaks.append(float(a[0].abs().max())))
             for n, mod in encoder(model).named_modules()
             if isinstance(mod, torch.nn.LayerNorm) and not n.startswith("embeddings")]
    try:
        out = run(model, ids, types)
    finally:
        for h in hooks:
            h.remove()
    return out, max(peaks)


def local_attention_effect() -> float:
    """How much tiny-modernbert's local attention matters on the medium text at 128 tokens: the largest
    |difference| of last_hidden_state from the same weights with every layer's window unbounded."""
    d = GOLDEN / "models" / "tiny-modernbert"
    t = torch.tensor(AutoTokenizer.from_pretrained(d)(dict(TEXTS)["medium"], truncation=True,
                                                      max_length=128)["input_ids"])[None]
    out = []
    for kw in [{}, {"local_attention": 4096}]:
        m = ModernBertModel.from_pretrained(d, dtype=torch.float32, attn_implementation="eager", **kw).eval()
        with torch.no_grad():
            out.append(m(input_ids=t).last_hidden_state)
    return float((out[0] - out[1]).abs().max())


def make_tower() -> list[dict]:
    rows = []
    texts = dict(TEXTS)
    for name, m in MODELS.items():
        out = TEXT / "tower" / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        d = GOLDEN / "models" / name
        tok = AutoTokenizer.from_pretrained(d)
        model = CLASSES[m["cls"]].from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        model64 = CLASSES[m["cls"]].from_pretrained(d, dtype=torch.float64, attn_implementation="eager").eval()
        st = None
        if m.get("sentence_transformers"):
            st = SentenceTransformer(str(d), device="cpu",
                                     model_kwargs={"dtype": torch.float32, "attn_implementation": "eager"})
        cases = [(t, L) for t in TOWER_TEXTS for L in TOWER_LENGTHS] + ([("long", 512)] if name in LONG_512 else [])
        if m.get("massive"):
            cases = [(t, 128) for t in MASSIVE_TEXTS]
        for tname, L in cases:
            e = tok(texts[tname], truncation=True, max_length=L, return_tensors="pt")
            ids, types = e["input_ids"], e.get("token_type_ids")
            with torch.no_grad():
                o, norm_in = norm_inputs_peak(model, ids, types)
                o64 = run(model64, ids, types)
            h = o.last_hidden_state[0].contiguous()
            t = {"input_ids": ids[0].contiguous(), "last_hidden_state": h}
            if types is not None:
                t["token_type_ids"] = types[0].contiguous()
            if getattr(o, "pooler_output", None) is not None:
                t["pooler_output"] = o.pooler_output.contiguous()
            if st is not None:
                st.max_seq_length = L
                s = st.encode([texts[tname]], convert_to_tensor=True, batch_size=1).reshape(1, -1).float()
                mean = torch.nn.functional.normalize(h.mean(0, keepdim=True), dim=-1)
                assert float((s - mean).abs().max()) < 1e-5, (name, tname, L)
                t["sentence_embedding"] = s.contiguous()
            floor = float((o64.last_hidden_state[0] - h.double()).abs().max())
            residual = max(float(x.abs().max()) for x in o.hidden_states)
            masked, unmasked = (0.0, 0.0) if ids.shape[1] == L else padding_check(
                model, ids, types, model.config.pad_token_id, L, h)
            save_file(t, out / f"{tname}-{L}.safetensors",
                      metadata={"model": name, "text": tname, "max_length": str(L)})
            rows.append(dict(model=name, text=tname, L=L, tokens=ids.shape[1], max_abs=float(h.abs().max()),
                             pooler=float(t["pooler_output"].abs().max()) if "pooler_output" in t else None,
                             residual=residual, norm_in=norm_in, floor=floor, masked=masked, unmasked=unmasked))
            print(f"  tower {name} {tname}-{L}: {ids.shape[1]} tokens, max |h| {rows[-1]['max_abs']:.3f}, "
                  f"residual {residual:.2f}, norm in {norm_in:.2f}, fp32-fp64 {floor:.2g}, padded masked {masked:.2g} "
                  f"unmasked {unmasked:.2g}")
    return rows


# --------------------------------------------------------------------------
# the text task set
# --------------------------------------------------------------------------

SHAPES = ["circle", "rectangle", "triangle"]
COLORS = ["black", "blue", "brown", "gray", "green", "red", "teal", "yellow"]
TEST_EVERY = 3  # every third question of each kind (sorted) is held out


def question_labels(q: str, answers: set[str]) -> dict[str, str]:
    if answers <= {"yes", "no"}:
        kind = "yes-no"
    elif answers <= set(SHAPES):
        kind = "shape"
    else:
        assert answers <= set(COLORS), (q, answers)
        kind = "color"
    words = q.rstrip("?").split()
    # Every text has every task (the task gate's rule): `none` where the
    # question names no colour or shape, or is not a yes-no question.
    labels = {"kind": kind, "color": "none", "shape": "none", "negated": "none"}
    named = [w for w in words if w in COLORS]
    if named:
        labels["color"] = named[0]
    named = [w for w in words if w in SHAPES]
    if named:
        labels["shape"] = named[0]
    if kind == "yes-no":
        labels["negated"] = "yes" if ("not" in words or "no" in words) else "no"
    return labels


def make_task() -> dict:
    """easy-vqa has 107 distinct questions, the same in its train and test splits (each asked of many
    images): the set is the distinct questions, labelled from the text alone (the answer's kind, read
    from easy-vqa's answers to it, and the colour, shape and negation it names), split by kind."""
    answers: dict[str, set[str]] = {}
    for qs, ans, _ in [get_train_questions(), get_test_questions()]:
        for q, a in zip(qs, ans, strict=True):
            answers.setdefault(q, set()).add(a)
    by_kind: dict[str, list[tuple[str, dict]]] = {}
    for q in sorted(answers):
        labels = question_labels(q, answers[q])
        by_kind.setdefault(labels["kind"], []).append((q, labels))
    lines, counts = [], {}
    for kind in sorted(by_kind):
        for i, (q, labels) in enumerate(by_kind[kind]):
            split = "test" if i % TEST_EVERY == TEST_EVERY - 1 else "train"
            lines.append((split, json.dumps({"text": q, "split": split, "labels": labels})))
            counts[(kind, split)] = counts.get((kind, split), 0) + 1
    lines.sort(key=lambda x: x[0] == "test")  # train first, as golden/task/labels.jsonl
    out = GOLDEN / "task-text"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "texts.jsonl").write_text("\n".join(line for _, line in lines) + "\n")
    print(f"  task-text: {len(lines)} questions, {counts}")
    return counts


# --------------------------------------------------------------------------
# README
# --------------------------------------------------------------------------

def tokenizer_row(kind: str) -> str:
    tok = Tokenizer.from_file(str(TEXT / ".tokenizers" / kind / "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "<pad>", "</s>",
                                            "<unk>", "<mask>", "<|endoftext|>", "<|padding|>"]}
    specials = ", ".join(f"`{t}`={i}" for t, i in ids.items() if i is not None)
    pipeline = {
        "wordpiece-uncased": "WordPiece (`##`), BertNormalizer (clean_text, Chinese characters split, lowercase, "
                             "accents stripped), BertPreTokenizer, `[CLS] $A [SEP]`",
        "wordpiece-cased": "WordPiece (`##`), BertNormalizer (clean_text, Chinese characters split, no lowercase, "
                           "accents kept), BertPreTokenizer, `[CLS] $A [SEP]`",
        "unigram": "Unigram, no normalizer, WhitespaceSplit then Metaspace (`▁`, prepend always), `<s> $A </s>`",
        "bytelevel-bpe": "byte-level BPE, NFC, ByteLevel (no prefix space, GPT-2 regex), `[CLS] $A [SEP]`, "
                         "`[MASK]` with lstrip (it takes the space before it)",
    }[kind]
    return f"| {kind} | {tok.get_vocab_size()} | {pipeline} | {specials} |"


def write_readme(lengths, tower_rows, task_counts, local_effect) -> None:
    v = {"torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
         "sentence-transformers": sentence_transformers.__version__, "numpy": np.__version__,
         "python": platform.python_version()}
    lines = ["# Golden data of the text encoders (BERT, MiniLM, XLM-RoBERTa, ModernBERT; issue 54)", "",
             "Written by `python/golden/make_golden_text.py` (`make golden-text`); do not edit.", "",
             "Made with " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".", "", "## Models (`models/<name>`)", "",
             "| name | class | config | tokenizer |", "|---|---|---|---|"]
    for name, m in MODELS.items():
        lines.append(f"| {name} | {m['cls']} | {json.dumps(m['config'])} | {m['tokenizer']} |")
    lines += ["",
              "`vocab_size` is the tokenizer's size (ModernBERT: rounded up to a multiple of 64, as its 50368 rows "
              "for 50285 tokens), and the pad, CLS and SEP ids are the tokenizer's. All weights bf16, saved by "
              "`save_pretrained` (safetensors), seeded random (norm weights 1 + 0.1 N(0,1), biases 0.05 N(0,1), "
              "embedding tables 0.5 N(0,1) including the padding rows, linear weights N(0, s), "
              "s = clamp(1/sqrt(fan_in), 0.05, 0.1)). No further tweak: padding matters through attention alone, "
              "and the `unmasked` column below shows how much. tiny-bert-mlm keeps its MLM head (`cls.*`, the "
              "decoder tied to the word embeddings, so not stored) and its encoder under `bert.`, no pooler. "
              "tiny-xlmr: position ids start at pad_token_id + 1 = 2 (transformers' "
              "`create_position_ids_from_input_ids`). tiny-modernbert: `layer_types` alternate global and "
              "local attention (global every 2nd layer, layer 0 global), `local_attention` 8 (a token sees "
              "tokens within 4 of it in local layers), rotary embeddings (theta 160000 global, 10000 local), "
              "GeGLU, no biases, a final norm, no pooler. The window matters: on the medium text at 128 tokens "
              f"last_hidden_state moves by up to {local_effect:.2g} when it is unbounded.",
              "",
              f"tiny-minilm has the sentence-transformers layout of all-MiniLM-L6-v2: `modules.json` (Transformer, "
              f"`1_Pooling` with mean pooling, `2_Normalize`: no files, so no directory), "
              f"`sentence_bert_config.json` (max_seq_length {ST_MAX_SEQ_LENGTH}, as all-MiniLM-L6-v2's, below "
              "the tokenizer's model_max_length 512), `config_sentence_transformers.json`.",
              "",
              f"tiny-bert-massive and tiny-modernbert-massive then get massive activations in the [SEP] token "
              f"(`make_massive`, as make_golden_encoders.py plants them in one patch token): channels "
              f"{MASSIVE_CHANNELS} of the [SEP] word embedding row hold 30 (dominating that token after the "
              "embedding norm, weight 1 and bias 0 there, and after block 0's norm before its MLP), and block 0's "
              "MLP writes about "
              f"{MASSIVE_BOOST:.0f} into them there alone, through hidden unit 0 (weight 10 on the channels, bias "
              "-50; ModernBERT: the GeGLU's `in` half, its gate a constant 1, hence `mlp_bias`). In "
              "tiny-bert-massive the sum x + f(x) that block 0's output LayerNorm reads passes fp16's 65,504 (the "
              "`norm in` column below; its hidden states, normalised, do not); in tiny-modernbert-massive the "
              "residual stream itself does from block 0 on (`residual`). Their reference outputs: the texts "
              f"{', '.join(MASSIVE_TEXTS)} at 128 tokens.",
              "", "## Tokenizers", "",
              "Trained with the `tokenizers` library on `text/corpus.txt` (composed by the script: English, French, "
              "German, Spanish, Chinese, Japanese, emoji, numbers; no Cyrillic or Hangul, so those fall to the "
              "unknown token in the WordPiece and Unigram vocabularies). Each model directory has `tokenizer.json`, "
              "`tokenizer_config.json` and `special_tokens_map.json`. transformers 5 loads BertTokenizer and "
              "XLMRobertaTokenizer by rebuilding their pipelines in code from tokenizer_config.json (only the "
              "vocabulary and the post-processor come from tokenizer.json); the pipelines here are the ones they "
              "rebuild, and the script checks that the `tokenizers` library reading tokenizer.json alone gives "
              "transformers' ids, masks and type ids for every text and max_length. The ModernBERT one is "
              "`PreTrainedTokenizerFast` (tokenizer.json as is) and, as ModernBERT's, returns no token_type_ids.",
              "", "| tokenizer | size | pipeline | special ids |", "|---|---|---|---|"]
    lines += [tokenizer_row(k) for k in TOKENIZERS]
    lines += ["", "## Texts (`text/texts.jsonl`) and token ids (`text/tokens/<model>.json`)", "",
              "`texts.jsonl`: one `{\"name\", \"text\"}` a line (UTF-8). `tokens/<model>.json`: `{\"model\", "
              "\"tokenizer\", \"tokenizer_class\", \"call\", \"max_lengths\", \"returns\", \"cases\"}`, a case "
              "per text and max_length (one line each): `{\"name\", \"max_length\", \"length\"` (the untruncated "
              "length, special tokens included) `, \"input_ids\", \"token_type_ids\"` (BERT models only) "
              "`, \"attention_mask\"}`, what `AutoTokenizer.from_pretrained(models/<model>)` gives for "
              "`tokenizer(text, truncation=True, max_length=L)`, no padding. Special tokens written in a text (the "
              "`special-tokens` text) are matched before normalisation, as the tokenizer's own. The empty text gives "
              "the two special tokens alone with every tokenizer; so does whitespace alone, except with byte-level "
              "BPE, which keeps the whitespace as tokens. Truncation keeps the closing special token (L - 2 text "
              "tokens). Untruncated lengths:", "",
              "| text | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
    for tname, _ in TEXTS:
        lines.append(f"| {tname} | " + " | ".join(str(lengths[m][tname]) for m in MODELS) + " |")
    lines += ["", "## Reference outputs (`text/tower/<model>/<text>-<L>.safetensors`)", "",
              "The model reloaded from disk in fp32, eager attention, on the ids of one text truncated to L "
              "tokens, unpadded, all-ones attention mask. Tensors: `input_ids` int64 [T], `token_type_ids` int64 "
              "[T] (BERT models), `last_hidden_state` float32 [T, D] (T the real tokens), `pooler_output` float32 "
              "[1, D] (tiny-bert, tiny-minilm, tiny-xlmr), `sentence_embedding` float32 [1, D] (tiny-minilm: "
              "sentence-transformers' `encode` with `max_seq_length` L: the mean over the tokens, then L2 "
              "normalisation; the script checks it against that mean of `last_hidden_state` to 1e-5). "
              "tiny-bert-mlm's are its encoder's (`model.bert`). Metadata: model, text, max_length.", "",
              "`max abs`: the largest |last_hidden_state|; `pooler`: the largest |pooler_output|; `residual`: the "
              "largest |value| of the hidden states (the embeddings' output and every layer's); `norm in`: the largest "
              "|input| of the blocks' and the final LayerNorms (post-norm BERT: the residual sums x + f(x), which "
              "its hidden states normalise; ModernBERT: the residual stream); `fp32-fp64`: the "
              "largest |difference| of last_hidden_state from an fp64 run of the same weights; `masked` and "
              "`unmasked`: the same ids padded with the pad token to L, the largest |difference| of the real "
              "tokens' states from the unpadded run with the padding masked, and without the mask (`-`: T = L, "
              "nothing to pad).", "",
              "| model | text | L | tokens | max abs | pooler | residual | norm in | fp32-fp64 | masked | unmasked |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tower_rows:
        pad = ("-", "-") if r["tokens"] == r["L"] else (f"{r['masked']:.2g}", f"{r['unmasked']:.2g}")
        pooler = "-" if r["pooler"] is None else f"{r['pooler']:.3f}"
        lines.append(f"| {r['model']} | {r['text']} | {r['L']} | {r['tokens']} | {r['max_abs']:.3f} | {pooler} | "
                     f"{r['residual']:.2f} | {r['norm_in']:.2f} | {r['floor']:.2g} | {pad[0]} | {pad[1]} |")
    n = {s: sum(c for (_, sp), c in task_counts.items() if sp == s) for s in ("train", "test")}
    kinds = ", ".join(f"{k}: {task_counts.get((k, 'train'), 0)} + {task_counts.get((k, 'test'), 0)}"
                      for k in sorted({k for k, _ in task_counts}))
    lines += ["", "## Text task set (`task-text/texts.jsonl`)", "",
              "The text task gate's labelled texts, one `{\"text\", \"split\", \"labels\"}` a line (train first), "
              "as `task/labels.jsonl` for images. easy-vqa (1.0) asks 107 distinct questions, the same ones in "
              "its train and test splits (38575 and 9673 questions: each asked of many images), so the set is "
              f"the distinct questions: {n['train']} train, {n['test']} test (every {TEST_EVERY}rd question of "
              f"each kind, in sorted order, held out; train + test per kind: {kinds}). Labels, read from the "
              "text and from easy-vqa's answers to it: `kind` (`shape`, `color` or `yes-no`: the type of every "
              "answer easy-vqa gives to the question), `color` and `shape` (the one the question names, else "
              "`none`), `negated` (`yes`/`no` for yes-no questions: `not` or `no` in it; `none` for the others); "
              "every text has every task, as the task gate requires."]
    (GOLDEN / "README-text.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    torch.set_num_threads(2)
    TEXT.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus()
    assert all("\n" not in line for line in corpus)
    (TEXT / "corpus.txt").write_text("\n".join(corpus) + "\n")
    with open(TEXT / "texts.jsonl", "w") as f:
        for name, text in TEXTS:
            f.write(json.dumps({"name": name, "text": text}, ensure_ascii=False) + "\n")
    shutil.rmtree(TEXT / ".tokenizers", ignore_errors=True)
    tok_dirs = make_tokenizers(corpus)
    make_models(tok_dirs)
    lengths = make_tokens()
    for m in MODELS:
        assert lengths[m]["long"] > 512, (m, lengths[m]["long"])
    tower = make_tower()
    counts = make_task()
    write_readme(lengths, tower, counts, local_attention_effect())
    shutil.rmtree(TEXT / ".tokenizers")


if __name__ == "__main__":
    main()
