"""Every window of text that compile calibrates and checks on, and that eval scores, begins as a
dialog does: BOS first for a model whose tokenizer puts one there (run/text.dialog_start)."""
from __future__ import annotations

import torch

from llm_tiny import BOS, tiny_tokenizer
from modelexport.llm.run.text import dialog_start, text_windows


def test_a_dialog_starts_with_bos_only_when_the_tokenizer_puts_one():
    tok = tiny_tokenizer()
    assert dialog_start(tok) == [BOS]
    tok.add_bos = False
    assert dialog_start(tok) == []


def test_windows_begin_with_bos_and_read_each_text_token_once():
    ids = [BOS, *range(10, 30)]                       # as tokenize gives them: BOS first
    wins = text_windows(ids, 8, [BOS])
    assert all(w[0] == BOS and len(w) <= 8 for w in wins), wins
    assert [t for w in wins for t in w[1:]] == list(range(10, 30))
    assert text_windows(list(range(10, 30)), 8, [BOS]) == wins          # mid-text ids: the same windows
    plain = text_windows(list(range(10, 30)), 8, [])
    assert [t for w in plain for t in w] == list(range(10, 30)) and plain[0] == list(range(10, 18))


class _Recorder:
    """A runner that returns uniform logits and keeps what it was fed."""
    max_seq_len = 16

    def __init__(self):
        self.fed = []

    def reset(self):
        pass

    def feed(self, ids):
        self.fed.append(list(ids))
        return torch.zeros(len(ids), 300)


def test_eval_scores_every_text_token_after_bos():
    from modelexport.runtime.evaluate import perplexity
    r = _Recorder()
    res = perplexity(r, list(range(10, 40)), 8, "float", lead=[BOS])
    assert all(w[0] == BOS for w in r.fed) and [t for w in r.fed for t in w[1:]] == list(range(10, 40))
    assert res.tokens == 30 and abs(res.perplexity - 300) < 1e-6      # uniform logits: the vocabulary size


def test_a_backend_that_puts_bos_first_is_believed_over_its_config():
    """transformers 5's GemmaTokenizer says add_bos_token False while its tokenizer.json's
    post-processor puts <bos> first: the dialog begins with BOS either way."""
    from tokenizers import processors

    from modelexport.llm.run.tokenizers import HFTokenizer
    backend = tiny_tokenizer().backend
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    tok = HFTokenizer(backend, bos_id=BOS, add_bos=False)
    assert tok.encode("a")[0] == BOS and dialog_start(tok) == [BOS]
