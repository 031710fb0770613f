"""trtpipe_runtime.grammar: the guide a request sends (validated as every runtime accepts it) and the token mask the
portable runtime applies, on the embedded model's real tokenizer with xgrammar (no model: random logits)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from tests.conftest import smollm2_tokenizer_dir
from trtpipe_runtime.decoding import DecodingError
from trtpipe_runtime.grammar import GUIDE_TYPES, MAX_GUIDE_BYTES, Guide, Grammars, parse_guide

VOCAB = 49152
EOS = 2
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", "北京"]},
                                                    "maxItems": 3}},
          "required": ["name", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())


@pytest.fixture(scope="module")
def grammars():
    return Grammars(str(smollm2_tokenizer_dir()), VOCAB, [EOS])


def _generate(grammars, guide, seed, steps=200):
    """Greedy over random logits, masked by the guide's grammar, until the end id: the generated ids."""
    gen = torch.Generator().manual_seed(seed)
    matcher = grammars.matcher(guide, [EOS])
    out = []
    for _ in range(steps):
        matcher.advance(out)
        row = torch.randn(VOCAB, generator=gen)
        matcher.mask_(row)
        token = EOS if torch.isfinite(row[EOS]) else int(torch.argmax(row))  # end as soon as the grammar may
        out.append(token)
        if token == EOS:
            return out
    raise AssertionError(f"no end id after {steps} steps")


@pytest.mark.parametrize("seed", range(4))
def test_a_json_schema_mask_gives_only_answers_that_validate(grammars, tokenizer, seed):
    ids = _generate(grammars, parse_guide("json_schema", json.dumps(SCHEMA, ensure_ascii=False)), seed)
    text = tokenizer.decode(ids[:-1])
    jsonschema.validate(json.loads(text), SCHEMA)


def test_regex_and_json_and_grammar_guides_constrain(grammars, tokenizer):
    text = tokenizer.decode(_generate(grammars, parse_guide("regex", "(yes|no|maybe)"), 0)[:-1])
    assert text in ("yes", "no", "maybe")
    row = torch.zeros(VOCAB)
    grammars.matcher(parse_guide("json", ""), [EOS]).mask_(row)
    first = [tokenizer.decode([i]) for i in torch.isfinite(row).nonzero().flatten().tolist()]
    assert first and all(t.startswith("{") for t in first)  # json: an object, nothing before it
    ebnf = 'root ::= "café " ("☕" | "🍵")'
    assert tokenizer.decode(_generate(grammars, parse_guide("ebnf_grammar", ebnf), 2)[:-1]) in ("café ☕", "café 🍵")


def test_unconstrained_random_logits_do_not_give_json(grammars, tokenizer):
    """The precondition of the tests above: without the mask the same draws are not valid JSON."""
    gen = torch.Generator().manual_seed(0)
    text = tokenizer.decode([int(torch.argmax(torch.randn(VOCAB, generator=gen))) for _ in range(20)])
    with pytest.raises(ValueError):
        json.loads(text)


def test_the_compiled_grammar_is_cached(grammars):
    guide = parse_guide("regex", "[0-9]{3}")
    before = (grammars.stats.compiles, grammars.stats.hits)
    grammars.compiled(guide)
    grammars.compiled(guide)
    assert (grammars.stats.compiles, grammars.stats.hits) == (before[0] + 1, before[1] + 1)


@pytest.mark.parametrize("kind, guide, words", [
    ("structural_tag", "{}", ["guided_decoding_guide_type", "'structural_tag'", "json_schema"]),
    ("json_schema", "{not json", ["json_schema", "not valid JSON"]),
    ("json_schema", "[1, 2]", ["json schema", "object"]),
    ("json_schema", "", ["needs guided_decoding_guide"]),
    ("regex", "a(b", ["invalid regex", "parenthesis"]),
    ("ebnf_grammar", "root ::= foo", ["invalid ebnf grammar", "foo"]),
    ("", "{}", ["guided_decoding_guide_type is not"]),
    ("regex", "a" * (MAX_GUIDE_BYTES + 1), ["bytes", "limit"]),
])
def test_a_bad_guide_is_refused_naming_it(kind, guide, words):
    with pytest.raises(DecodingError) as err:
        parse_guide(kind, guide)
    for word in words:
        assert word in str(err.value)
    assert "/project/cpp" not in str(err.value)  # xgrammar's C++ log prefix is cut


def test_no_guide_is_none_and_bytes_are_read():
    assert parse_guide(None, None) is None and parse_guide(b"", b"") is None
    assert parse_guide(b"regex", "a+".encode()) == Guide("regex", "a+")
    assert GUIDE_TYPES == ("json", "json_schema", "regex", "ebnf_grammar")
