"""Text <-> token ids, special tokens and chat templates, on top of the `tokenizers` library."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from surge.models.formats.chat_templates import BUILTIN as BUILTIN_TEMPLATES
from surge.models.formats.chat_templates import TURN_ENDS
from surge.models.formats.gguf_file import GGUFSource
from surge.models.formats.gguf_vocab import tokenizer_from_gguf


class Tokenizer:
    """A loaded tokenizer plus the facts a serving engine needs (BOS/EOS, chat template)."""

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_id: int | None,
        extra_eos_token_ids: Sequence[int] = (),
        add_bos_token: bool = False,
        chat_template: str | None = None,
    ) -> None:
        self._backend = backend
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        eos = [] if eos_token_id is None else [eos_token_id]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys([*eos, *extra_eos_token_ids]))
        self.add_bos_token = add_bos_token
        self._chat_template = chat_template
        self._special_ids = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        )
        self._template: jinja2.Template | None = None

    @property
    def chat_template(self) -> str | None:
        """The Jinja chat template (None: the model has none)."""
        return self._chat_template

    @chat_template.setter
    def chat_template(self, template: str | None) -> None:
        self._chat_template, self._template = template, None

    @property
    def backend(self) -> HFTokenizer:
        """The underlying `tokenizers.Tokenizer`."""
        return self._backend

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self._backend.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self._backend.id_to_token(self.eos_token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in it are matched whole. BOS is
        prepended only when `add_special_tokens` and the model wants one."""
        ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        for token_id in ids:
            self._check_id(token_id)
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry for `token_id` (byte-level spelling, e.g. "Ġworld")."""
        self._check_id(token_id)
        token = self._backend.id_to_token(token_id)
        if token is None:
            raise ValueError(f"token id {token_id} has no vocabulary entry")
        return token

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render a conversation into prompt text with the model's Jinja chat template."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        # tools/documents default to None (not undefined), as transformers passes them.
        variables: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": None,
            "documents": None,
        }
        variables.update(kwargs)
        return self._template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            **variables,
        )

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} out of range [0, {self.vocab_size})")

    @classmethod
    def from_gguf(cls, reader: GGUFSource) -> Tokenizer:
        def field(name: str) -> Any:
            found = reader.get_field(f"tokenizer.{name}")
            return None if found is None else found.contents()

        bos, eos = field("ggml.bos_token_id"), field("ggml.eos_token_id")
        extra_eos = [field("ggml.eot_token_id"), field("ggml.eom_token_id")]
        add_bos = field("ggml.add_bos_token")
        if add_bos is None:
            # llama.cpp's default: SentencePiece vocabularies get BOS, byte-level ones do not.
            add_bos = field("ggml.model") == "llama"
        backend = tokenizer_from_gguf(reader)
        extra_eos += [backend.token_to_id(t) for t in TURN_ENDS]
        arch = reader.get_field("general.architecture")
        template = field("chat_template")
        if template is None and arch is not None:
            template = BUILTIN_TEMPLATES.get(str(arch.contents()))
        return cls(
            backend,
            bos_token_id=None if bos is None else int(bos),
            eos_token_id=None if eos is None else int(eos),
            extra_eos_token_ids=[int(i) for i in extra_eos if i is not None],
            add_bos_token=bool(add_bos),
            chat_template=template,
        )

    @classmethod
    def from_hf_folder(cls, path: Path) -> Tokenizer:
        """Load tokenizer.json (+ tokenizer_config.json, chat_template.jinja,
        generation_config.json) from a transformers model folder."""
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"{path} has no tokenizer.json")
        backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
        config = _read_json(path / "tokenizer_config.json")
        gen_config = _read_json(path / "generation_config.json")
        bos = _token_id(backend, config.get("bos_token"))
        eos = _token_id(backend, config.get("eos_token"))
        gen_eos = gen_config.get("eos_token_id")
        extra = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        if eos is None and extra:
            eos = extra[0]
        add_bos = config.get("add_bos_token")
        if add_bos is None:
            # No flag: BOS is added exactly when tokenizer.json's post-processor adds it.
            probe = backend.encode("", add_special_tokens=True).ids
            add_bos = bos is not None and probe[:1] == [bos]
        return cls(
            backend,
            bos_token_id=bos,
            eos_token_id=eos,
            extra_eos_token_ids=extra,
            add_bos_token=bool(add_bos),
            chat_template=_hf_chat_template(path, config),
        )


def _compile_template(source: str) -> jinja2.Template:
    # Same environment transformers uses, so templates written for HF render identically.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes; chat templates want plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def _token_id(backend: HFTokenizer, token: Any) -> int | None:
    # tokenizer_config.json spells a special token as a string or as {"content": ...}.
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    found = backend.token_to_id(token)
    return None if found is None else int(found)


def _hf_chat_template(path: Path, config: dict[str, Any]) -> str | None:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        # Several named templates: the serving default is the one called "default".
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
