"""One tokenizer interface over the three places a model's tokenizer comes from.

- a Hugging Face `tokenizer.json` (the `tokenizers` library; `tokenizer_config.json` beside it
  gives BOS/EOS, `add_bos_token` and the chat template),
- a SentencePiece `.model` (Llama-2 / Mistral layout),
- the tokenizer stored inside a GGUF (vocabulary, merges, special ids and chat template as
  metadata); transformers' GGUF converter rebuilds it as a `tokenizers.Tokenizer`, and the
  result is cached as a `tokenizer.json` keyed by the file, because reading 50k strings out of
  a GGUF takes seconds and the result never changes.

Chat templates are rendered with jinja2 the way transformers renders them (sandboxed,
`trim_blocks`/`lstrip_blocks`, `raise_exception`, `tojson`, `strftime_now`), so a model's own
template gives the same text here as in transformers. `StreamDecoder` turns token ids into
text pieces as they arrive without splitting a multi-byte character or eating the space that
starts a word.
"""
from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Sequence

import jinja2
import sentencepiece as spm
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend

from ...core.cache import Cache, cache_key
from ...core.errors import InputError
from ...core.file_hash import file_sha256

Message = dict[str, Any]


# --------------------------------------------------------------------------------------------
# chat templates
def render_chat_template(template: str, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                         **context: Any) -> str:
    """`template` applied to `messages` with transformers' jinja2 settings."""
    def raise_exception(message):
        raise InputError(f"the chat template refused the conversation: {message}",
                         "check the roles and their order (many templates want user/assistant turns alternating)")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateError as e:
        raise InputError(f"the model's chat template does not parse: {e}") from None
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise InputError(f"a chat message must be a dict with 'role' and 'content', got {m!r}")
    return compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt, **context)


# --------------------------------------------------------------------------------------------
class Tokenizer(ABC):
    """encode/decode, special ids, vocabulary size and the model's chat template."""

    kind: str = "?"
    source: str = ""
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    add_bos: bool = False
    chat_template: str | None = None

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids (including added/special tokens)."""

    @abstractmethod
    def _encode_plain(self, text: str) -> list[int]:
        """Token ids of `text`, special-token strings in it mapped to their ids, no BOS/EOS added."""

    @abstractmethod
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        ...

    @abstractmethod
    def id_to_token(self, token_id: int) -> str | None:
        ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with `add_special_tokens` a BOS is put first when the model wants one."""
        ids = self._encode_plain(text)
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_id is None else self.id_to_token(self.bos_id)

    @property
    def eos_token(self) -> str | None:
        return self.id_to_token(self.eos_ids[0]) if self.eos_ids else None

    def render_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
                    template: str | None = None) -> str:
        template = template or self.chat_template
        if not template:
            raise InputError(f"the tokenizer of {self.source or 'this model'} has no chat template",
                             "use plain --prompt text without --chat, or give the model a chat template")
        return render_chat_template(template, messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def encode_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered conversation. Like transformers, the template's text is
        encoded without adding special tokens (templates that want a BOS write it themselves)."""
        return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt),
                           add_special_tokens=False)

    def stream_decoder(self, context_ids: Sequence[int] = (), *, skip_special_tokens: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, context_ids, skip_special_tokens=skip_special_tokens)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "source": self.source, "vocab_size": self.vocab_size, "bos_id": self.bos_id,
                "eos_ids": list(self.eos_ids), "add_bos": self.add_bos, "has_chat_template": bool(self.chat_template)}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind} vocab={self.vocab_size} bos={self.bos_id} eos={list(self.eos_ids)}>"


# --------------------------------------------------------------------------------------------
class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (what a `tokenizer.json` holds)."""

    kind = "hf"

    def __init__(self, backend, *, bos_id: int | None = None, eos_ids: Iterable[int] = (), add_bos: bool | None = None,
                 chat_template: str | None = None, source: str = "", kind: str | None = None):
        self.backend = backend
        self.source = source
        self.kind = kind or self.kind
        self.bos_id = bos_id
        self.eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
        self.chat_template = chat_template
        # Many tokenizer.json files add BOS in their post-processor already (Llama 3): then the
        # backend's own special-token handling is what `add_special_tokens` means.
        probe = backend.encode("a", add_special_tokens=True).ids
        plain = backend.encode("a", add_special_tokens=False).ids
        self._backend_adds_specials = probe != plain
        # a backend that puts BOS first itself does so whatever the config says (transformers 5's
        # GemmaTokenizer: add_bos_token False, its post-processor adds <bos>)
        backend_bos = self._backend_adds_specials and bos_id is not None and probe[:1] == [bos_id]
        self.add_bos = backend_bos or (bool(add_bos) if add_bos is not None else self._backend_adds_specials)
        self._special_ids = frozenset(_added_special(backend))

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def _encode_plain(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if add_special_tokens and self._backend_adds_specials:
            return list(self.backend.encode(text, add_special_tokens=True).ids)
        return super().encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(int(token_id))

    def save(self, folder: str | Path) -> Path:
        """Write `tokenizer.json` + a minimal `tokenizer_config.json` (ExecuTorch's runner reads the first)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(folder / "tokenizer.json"))
        cfg = {"bos_token": self.bos_token, "eos_token": self.eos_token, "add_bos_token": self.add_bos,
               "eos_token_ids": list(self.eos_ids)}
        if self.chat_template:
            cfg["chat_template"] = self.chat_template
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1, ensure_ascii=False))
        return folder / "tokenizer.json"


def _added_special(backend) -> list[int]:
    try:
        return [int(i) for i, t in backend.get_added_tokens_decoder().items() if t.special]
    except AttributeError:  # older tokenizers
        return []


def _token_value(v: Any) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as AddedToken dicts."""
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


def load_tokenizer_json(path: str | Path, *, chat_template: str | None = None) -> HFTokenizer:
    """A `tokenizer.json` (file or folder holding one); `tokenizer_config.json` beside it, if any,
    gives BOS/EOS, add_bos_token and the chat template (also `chat_template.jinja`)."""
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise InputError(f"tokenizer file not found: {file}")
    try:
        backend = Backend.from_file(str(file))
    except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
        raise InputError(f"{file} is not a valid tokenizer.json ({e})") from None
    folder = file.parent
    cfg: dict[str, Any] = {}
    if (folder / "tokenizer_config.json").is_file():
        try:
            cfg = json.loads((folder / "tokenizer_config.json").read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{folder / 'tokenizer_config.json'} is not valid JSON: {e}") from None
    template = chat_template or cfg.get("chat_template")
    if isinstance(template, list):  # several named templates: take the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not template and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    bos = _token_value(cfg.get("bos_token"))
    eos = _token_value(cfg.get("eos_token"))
    eos_ids = list(cfg.get("eos_token_ids") or [])
    gen_cfg = folder / "generation_config.json"
    if gen_cfg.is_file():  # generation_config.json lists every id that ends a turn (Llama 3: several)
        try:
            g = json.loads(gen_cfg.read_text()).get("eos_token_id")
            eos_ids += [g] if isinstance(g, int) else list(g or [])
        except json.JSONDecodeError:
            pass
    if eos is not None and backend.token_to_id(eos) is not None:
        eos_ids.insert(0, backend.token_to_id(eos))
    return HFTokenizer(backend, bos_id=backend.token_to_id(bos) if bos else None, eos_ids=eos_ids,
                       add_bos=cfg.get("add_bos_token"), chat_template=template, source=str(file), kind="hf")


def from_transformers(tok, *, chat_template: str | None = None, eos_ids: Iterable[int] = (), source: str = "") -> HFTokenizer:
    """Wrap a transformers fast tokenizer (what the LLM frontends return)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise InputError(f"{type(tok).__name__} is not a fast tokenizer", "give a tokenizer.json (a fast tokenizer)")
    template = chat_template or (tok.chat_template if isinstance(getattr(tok, "chat_template", None), str) else None)
    eos = [tok.eos_token_id] if getattr(tok, "eos_token_id", None) is not None else []
    return HFTokenizer(backend, bos_id=getattr(tok, "bos_token_id", None), eos_ids=[*eos, *eos_ids],
                       add_bos=getattr(tok, "add_bos_token", None), chat_template=template,
                       source=source or str(getattr(tok, "name_or_path", "")), kind="hf")


# --------------------------------------------------------------------------------------------
class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece `.model`. Special-token strings written in the text (`<s>`, `</s>`, a
    template's control tokens) are split out and mapped to their ids, as transformers' Llama
    tokenizer does; SentencePiece itself would spell them out letter by letter."""

    kind = "sentencepiece"

    def __init__(self, path: str | Path, *, chat_template: str | None = None, add_bos: bool = True,
                 extra_eos_ids: Iterable[int] = ()):
        path = Path(path)
        if not path.is_file():
            raise InputError(f"SentencePiece model not found: {path}")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as e:
            raise InputError(f"{path} is not a SentencePiece model ({e})") from None
        self.source = str(path)
        self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        eos = [self.sp.eos_id()] if self.sp.eos_id() >= 0 else []
        self.eos_ids = tuple(dict.fromkeys([*eos, *extra_eos_ids]))
        self.add_bos = add_bos and self.bos_id is not None
        self.chat_template = chat_template
        n = self.sp.get_piece_size()
        self._special = {self.sp.id_to_piece(i): i for i in range(n)
                         if self.sp.is_control(i) or self.sp.is_unknown(i) or _is_user_defined(self.sp, i)}
        self._special_ids = frozenset(i for i in range(n) if self.sp.is_control(i))
        alts = sorted(self._special, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(s) for s in alts) + ")") if alts else None

    @property
    def vocab_size(self) -> int:
        return int(self.sp.get_piece_size())

    def _encode_plain(self, text: str) -> list[int]:
        if not self._split:
            return list(self.sp.encode(text))
        out: list[int] = []
        for part in self._split.split(text):
            if not part:
                continue
            if part in self._special:
                out.append(self._special[part])
            else:
                out.extend(self.sp.encode(part))
        return out

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens or not any(i in self._special_ids for i in ids):
            return self.sp.decode([i for i in ids if i not in self._special_ids])
        # SentencePiece drops control pieces on decode; write them out where they stand.
        out, run = [], []
        for i in ids:
            if i in self._special_ids:
                if run:
                    out.append(self.sp.decode(run))
                    run = []
                out.append(self.sp.id_to_piece(i))
            else:
                run.append(i)
        if run:
            out.append(self.sp.decode(run))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        i = self.sp.piece_to_id(token)
        return None if (i == self.sp.unk_id() and token != self.sp.id_to_piece(i)) else int(i)

    def id_to_token(self, token_id: int) -> str | None:
        return self.sp.id_to_piece(int(token_id)) if 0 <= int(token_id) < self.vocab_size else None


def _is_user_defined(sp, i: int) -> bool:
    f = getattr(sp, "is_user_defined", None)
    return bool(f(i)) if f else False


# --------------------------------------------------------------------------------------------
@dataclass
class GgufTokenizerMeta:
    """What a GGUF says about its tokenizer, besides the vocabulary itself."""

    model: str | None
    pre: str | None
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    add_bos: bool | None
    chat_template: str | None
    vocab_size: int
    extra: dict[str, Any] = field(default_factory=dict)


def read_gguf_tokenizer_meta(path: str | Path) -> GgufTokenizerMeta:
    import gguf
    from transformers.integrations.gguf.reader import read_gguf_metadata

    try:
        md, _ = read_gguf_metadata(str(path), ())
    except Exception as e:  # a damaged header raises anything from struct.error to ValueError
        raise InputError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None
    K = gguf.Keys.Tokenizer
    tokens = md.get(K.LIST)
    n = tokens if isinstance(tokens, int) else len(tokens or [])
    if not md.get(K.MODEL) or not n:
        raise InputError(f"{path} carries no tokenizer", "use a GGUF converted with its tokenizer")
    return GgufTokenizerMeta(model=md.get(K.MODEL), pre=md.get(K.PRE), bos_id=md.get(K.BOS_ID),
                             eos_id=md.get(K.EOS_ID), eot_id=md.get(K.EOT_ID), add_bos=md.get(K.ADD_BOS),
                             chat_template=md.get(K.CHAT_TEMPLATE), vocab_size=n)


def load_gguf_tokenizer(path: str | Path, *, cache: bool = True) -> HFTokenizer:
    """The tokenizer inside a GGUF file, rebuilt by transformers' converter; cached as tokenizer.json."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"GGUF file not found: {path}")
    meta = read_gguf_tokenizer_meta(path)
    backend = None
    entry = None
    if cache:
        import transformers
        key = cache_key("gguf-tokenizer", file_sha256(path), transformers.__version__)
        c = Cache()
        entry = c.get("tokenizers", key)
        if entry is None:
            def build(tmp: Path) -> dict:
                _convert_gguf_tokenizer(path).save(str(tmp / "tokenizer.json"))
                return {"source": str(path)}
            entry, _ = c.get_or_create("tokenizers", key, build)
    backend = Backend.from_file(str(entry / "tokenizer.json")) if entry else _convert_gguf_tokenizer(path)
    # llama.cpp's rule: a SentencePiece ("llama") vocabulary gets a BOS unless the file says otherwise.
    add_bos = meta.add_bos if meta.add_bos is not None else meta.model == "llama"
    eos = [i for i in (meta.eos_id, meta.eot_id) if i is not None]
    return HFTokenizer(backend, bos_id=meta.bos_id, eos_ids=eos, add_bos=add_bos, chat_template=meta.chat_template,
                       source=str(path), kind="gguf")


def _convert_gguf_tokenizer(path: Path):
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

    try:
        arch, tdict, _ = get_gguf_tokenizer(str(path))
        backend, _ = convert_gguf_tokenizer(arch, tdict)
    except (KeyError, ValueError, NotImplementedError) as e:
        raise InputError(f"the tokenizer inside {path} cannot be rebuilt ({type(e).__name__}: {e})",
                         "use an HF folder with a tokenizer.json instead") from None
    return backend


# --------------------------------------------------------------------------------------------
def load_tokenizer(path: str | Path, **kw: Any) -> Tokenizer:
    """Any of the three kinds, by what the path is: `.gguf`, `.model`/`.model.v*` (SentencePiece),
    `tokenizer.json` or a folder holding one (or a `tokenizer.model`)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"tokenizer not found: {p}")
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return load_tokenizer_json(p, **kw)
        if (p / "tokenizer.model").is_file():
            return SentencePieceTokenizer(p / "tokenizer.model", **kw)
        raise InputError(f"{p} holds no tokenizer.json or tokenizer.model")
    if p.suffix == ".gguf":
        return load_gguf_tokenizer(p, **kw)
    if p.suffix == ".json":
        return load_tokenizer_json(p, **kw)
    with open(p, "rb") as f:
        head = f.read(4)
    if head == b"GGUF":
        return load_gguf_tokenizer(p, **kw)
    return SentencePieceTokenizer(p, **kw)


def check_vocab(tokenizer: Tokenizer, model_vocab_size: int, where: str = "the model") -> None:
    """A tokenizer with ids the model's embedding has no row for is the wrong tokenizer."""
    n = tokenizer.vocab_size
    if n > model_vocab_size:
        raise InputError(f"the tokenizer ({tokenizer.source or tokenizer.kind}) has {n:,} tokens but {where} "
                         f"has only {model_vocab_size:,} embedding rows: they do not belong together",
                         "use the tokenizer that came with the model")
    worst = max([i for i in (tokenizer.bos_id, *tokenizer.eos_ids) if i is not None], default=-1)
    if worst >= model_vocab_size:
        raise InputError(f"the tokenizer's special id {worst} is outside {where}'s vocabulary ({model_vocab_size:,})",
                         "use the tokenizer that came with the model")


# --------------------------------------------------------------------------------------------
class StreamDecoder:
    """Token ids in, text pieces out, as they become certain.

    Decoding ids one by one is wrong twice: a character split over several byte tokens comes
    out as U+FFFD, and SentencePiece drops the space at the start of a lone piece. So each new
    id is decoded together with a few ids before it, and only the text past what those gave is
    emitted; an unfinished character (trailing U+FFFD) is held back until its bytes are in.
    `context_ids` (the last prompt tokens) make the first generated piece right too.
    """

    def __init__(self, tokenizer: Tokenizer, context_ids: Sequence[int] = (), *, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = [int(i) for i in list(context_ids)[-6:]]
        self.prefix = 0
        self.read = len(self.ids)
        self.text = ""  # everything emitted so far

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self.prefix:self.read])
        now = self._decode(self.ids[self.prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd") and now.startswith(before):
            piece = now[len(before):]
            self.prefix, self.read = self.read, len(self.ids)
            self.text += piece
            return piece
        if len(self.ids) - self.prefix > 16 and not now.endswith("\ufffd"):
            # decoders that rewrite earlier text (rare): give up on the window, emit the difference
            piece = now[len(before):] if now.startswith(before) else ""
            self.prefix, self.read = self.read, len(self.ids)
            self.text += piece
            return piece
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        before = self._decode(self.ids[self.prefix:self.read])
        now = self._decode(self.ids[self.prefix:])
        piece = now[len(before):] if now.startswith(before) else ""
        self.prefix = self.read = len(self.ids)
        self.text += piece
        return piece
