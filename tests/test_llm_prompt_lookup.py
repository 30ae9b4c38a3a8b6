"""Prompt lookup (speculative decoding with drafts copied from earlier text) on real tiny Llamas
through the pure-torch static decoder (ar8 + ar1): the text is that of plain greedy decoding token
for token, with drafts both accepted and rejected; a broken acceptance rule is caught; EOS, stop
strings, max-new-tokens, the context's end and the sliding window stop where plain decoding stops,
and the cache afterwards holds what plain decoding leaves there; refusals."""
from __future__ import annotations

import pytest

from llm_tiny import tiny_llama, tiny_tokenizer
from modelexport.core.errors import InputError
from modelexport.llm import Generator, StaticGraphSession
from modelexport.llm.run.decode_steps import LookupSteps, propose

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ("the cat sat on the mat, the cat sat on the mat, the cat", "Markets rose on Tuesday as investors")


# -------------------------------------------------------------------------------- drafts
def test_propose_takes_the_longest_ngram_at_its_most_recent_occurrence():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 9, 2, 3, 4, 5, 1, 2, 3]
    assert propose(tokens, 3, 2) == [9, 2]          # "1 2 3" occurred at 0..2, followed by 9 2
    assert propose(tokens, 2, 2) == [4, 5]          # "2 3": most recent at 4..5, followed by 4 5
    assert propose(tokens, 1, 3) == [4, 5, 1]       # "3" at 5
    assert propose(tokens, 3, 9) == [9, 2, 3, 4, 5, 1, 2, 3]   # as many as follow
    assert propose([5, 6, 7, 8], 3, 4) == []        # "8" never occurred before
    assert propose([5, 6, 7, 8], 3, 0) == [] and propose([5], 3, 2) == []
    assert propose([7, 1, 7, 2, 7], 3, 1) == [2]    # no longer n-gram occurred: "7", most recent
    # a run repeating itself: the most recent occurrence with `draft` tokens after it
    assert propose([4, 4, 4, 4, 4, 4], 2, 3) == [4, 4, 4]
    assert propose([3, 4, 4, 4], 2, 3) == [4]       # none has 3 after it: the most recent found


# -------------------------------------------------------------------------------- equality
@pytest.fixture(scope="module")
def models():
    """Untied tiny Llamas (their greedy text varies, so drafts are both kept and refused) over ar8 + ar1."""
    from modelexport.llm.model.static_decoder import StaticDecoder, StaticDecoderConfig
    tok = tiny_tokenizer()
    return [(StaticDecoder(tiny_llama(2, seed=s, tie_word_embeddings=False),
                           StaticDecoderConfig(n_tokens=8, max_seq_len=96)), tok) for s in range(3)]


def _gen(model, **kw):
    decoder, tok = model
    return Generator(StaticGraphSession.from_decoder(decoder, (8, 1)), tok, backend="torch-static", **kw)


def _runs(models, draft_ngram, n=40, **kw):
    """(plain result, prompt-lookup result) for every model x prompt x (draft, ngram)."""
    for m in models:
        g = _gen(m)
        for prompt in PROMPTS:
            plain = g.generate(prompt, max_new_tokens=n, stop_on_eos=False, **kw)
            for draft, ngram in draft_ngram:
                yield plain, g.generate(prompt, max_new_tokens=n, stop_on_eos=False, prompt_lookup=draft, ngram=ngram, **kw)


def test_greedy_text_equals_plain_greedy_token_for_token(models):
    drafted = accepted = steps = plain_steps = 0
    for plain, res in _runs(models, [(1, 1), (2, 3), (4, 2), (7, 3)]):
        assert res.token_ids == plain.token_ids and res.text == plain.text
        s = res.stats
        assert s.stop_reason == "max_new_tokens" and s.generated_tokens == 40
        assert s.target_steps + s.accepted_tokens == 39 == plain.stats.target_steps    # each step: accepted + 1
        assert s.tokens_per_step == round(39 / s.target_steps, 3)
        drafted, accepted = drafted + s.drafted_tokens, accepted + s.accepted_tokens
        steps, plain_steps = steps + s.target_steps, plain_steps + plain.stats.target_steps
    assert plain.stats.drafted_tokens == 0 and plain.stats.tokens_per_step == 1.0
    assert 0 < accepted < drafted          # both branches of the check ran
    assert steps < plain_steps


def test_a_broken_acceptance_rule_is_caught(models, monkeypatch):
    """The equality above can fail: keeping one draft the model did not agree with changes the text."""
    def keep_one_more(self, drafts):
        fed = [self.tok, *drafts]
        logits = self.session.feed_all(fed)
        kept = 0
        while kept < len(drafts) and self._sample(logits[kept]) == drafts[kept]:
            kept += 1
        kept = min(kept + 1, len(drafts))   # the bug
        self.session.rewind(self.session.position - (len(drafts) - kept))
        self.gen.history.extend(fed[:1 + kept])
        out = [*drafts[:kept], self._sample(logits[kept])]
        self.tok, self.queue, self.ahead = out[0], out[1:], kept
    monkeypatch.setattr(LookupSteps, "_check", keep_one_more)
    assert any(res.token_ids != plain.token_ids for plain, res in _runs(models[:2], [(4, 2)]))


def test_repetition_penalty_is_applied_as_in_plain_greedy(models):
    for plain, res in _runs(models[:1], [(4, 3)], n=30, repetition_penalty=1.3):
        assert res.token_ids == plain.token_ids


# -------------------------------------------------------------------------------- stopping
def test_stops_where_plain_decoding_stops_and_leaves_the_same_cache(models):
    m = models[2]
    ids = m[1].encode(PROMPTS[0])
    free = _gen(m).generate(ids, max_new_tokens=40, stop_on_eos=False).token_ids
    for n in range(1, 41, 3):                         # max_new_tokens inside a step's accepted drafts
        a, b = _gen(m), _gen(m)
        pa = a.generate(ids, max_new_tokens=n, stop_on_eos=False)
        pb = b.generate(ids, max_new_tokens=n, stop_on_eos=False, prompt_lookup=6, ngram=2)
        assert pb.token_ids == pa.token_ids == free[:n] and pb.stats.stop_reason == "max_new_tokens"
        assert b.history == a.history and b.session.position == a.session.position == len(ids) + n - 1
    for j in range(1, 40, 4):                         # EOS: a token of the free run declared one
        a, b = _gen(m), _gen(m)
        a.eos_ids = b.eos_ids = frozenset({free[j]})
        pa, pb = a.generate(ids, max_new_tokens=40), b.generate(ids, max_new_tokens=40, prompt_lookup=6, ngram=2)
        assert pb.token_ids == pa.token_ids and pb.stats.stop_reason == pa.stats.stop_reason == "eos"
        assert pb.text == pa.text and b.history == a.history and b.session.position == a.session.position
    a, b = _gen(m), _gen(m)
    full = a.generate(ids, max_new_tokens=40, stop_on_eos=False).text
    for stop in {full[i:i + 2] for i in range(3, 30, 5)}:
        pa = a.generate(ids, max_new_tokens=40, stop_on_eos=False, stop_strings=(stop,))
        pb = b.generate(ids, max_new_tokens=40, stop_on_eos=False, stop_strings=(stop,), prompt_lookup=6, ngram=2)
        assert (pb.text, pb.token_ids, pb.stats.stop_reason) == (pa.text, pa.token_ids, "stop_string")
        assert b.history == a.history and b.session.position == a.session.position


def test_a_stop_inside_a_step_drops_the_kept_drafts_after_it(monkeypatch):
    """A tied tiny Llama repeats one token: once the run is long enough every draft is kept, so a
    stop string or a stream closed early stops in the middle of a step's kept drafts."""
    from modelexport.llm.model.static_decoder import StaticDecoder, StaticDecoderConfig
    model = (StaticDecoder(tiny_llama(2), StaticDecoderConfig(n_tokens=8, max_seq_len=96)), tiny_tokenizer())
    dropped = []
    finish = LookupSteps.finish
    monkeypatch.setattr(LookupSteps, "finish", lambda self: (dropped.append(self.ahead), finish(self)))
    a, b = _gen(model), _gen(model)
    full = a.generate(PROMPTS[0], max_new_tokens=30, stop_on_eos=False)
    assert len(set(full.token_ids)) == 1
    for stop_at in (10, 13, 17):
        stop = full.text[:stop_at]
        pa = a.generate(PROMPTS[0], max_new_tokens=30, stop_on_eos=False, stop_strings=(stop,))
        pb = b.generate(PROMPTS[0], max_new_tokens=30, stop_on_eos=False, stop_strings=(stop,), prompt_lookup=7)
        assert (pb.text, pb.token_ids, pb.stats.stop_reason) == (pa.text, pa.token_ids, "stop_string")
        assert b.history == a.history and b.session.position == a.session.position == len(pa.prompt_ids) + stop_at - 1
    stream = b.stream(PROMPTS[0], max_new_tokens=30, stop_on_eos=False, prompt_lookup=7)
    for _ in range(12):
        next(stream)
    res = stream.close()
    assert res.stats.stop_reason == "stopped" and len(res.token_ids) == 12
    assert b.history == res.prompt_ids + res.token_ids[:-1] and b.session.position == len(b.history)
    assert sum(1 for n in dropped if n > 0) >= 3        # kept drafts past the stop were dropped from the cache


def test_context_full_and_sliding_window_as_in_plain_decoding(models):
    m = models[1]
    prompt = "y" * 70                                 # 71 tokens of a 96-token context
    for sliding in (False, True):
        a, b = _gen(m), _gen(m)
        pa = a.generate(prompt, max_new_tokens=60, stop_on_eos=False, sliding_window=sliding)
        pb = b.generate(prompt, max_new_tokens=60, stop_on_eos=False, sliding_window=sliding, prompt_lookup=7, ngram=3)
        assert pb.token_ids == pa.token_ids and pb.stats.stop_reason == pa.stats.stop_reason
        assert pb.stats.context_shifts == pa.stats.context_shifts
        assert b.history == a.history and b.session.position == a.session.position
    assert pa.stats.context_shifts >= 1 and pb.stats.accepted_tokens > 0


def test_chat_turns_and_a_stream_closed_early(models):
    m = models[0]
    a, b = _gen(m), _gen(m)
    ca, cb = a.chat(system="be brief"), b.chat(system="be brief")
    for text in ("the cat sat on the mat", "and the cat sat on the mat again"):
        ra, rb = ca.send(text, max_new_tokens=8, stop_on_eos=False), cb.send(text, max_new_tokens=8, stop_on_eos=False,
                                                                             prompt_lookup=4)
        assert rb.token_ids == ra.token_ids and rb.stats.prefill_tokens == ra.stats.prefill_tokens
    stream = b.stream(PROMPTS[0], max_new_tokens=40, stop_on_eos=False, prompt_lookup=7)
    next(stream), next(stream)
    res = stream.close()
    assert res.stats.stop_reason == "stopped"
    assert b.session.position == len(b.history) == len(res.prompt_ids) + len(res.token_ids) - 1
    assert b.history == res.prompt_ids + res.token_ids[:-1]


# -------------------------------------------------------------------------------- refusals
def test_refusals(models):
    g = _gen(models[0])
    with pytest.raises(InputError, match="--temperature"):
        g.generate("hi", max_new_tokens=4, prompt_lookup=4, temperature=0.7)
    for bad in ({"prompt_lookup": -1}, {"prompt_lookup": 65}, {"ngram": 0}, {"ngram": 17}):
        with pytest.raises(InputError, match=r"--prompt-lookup|--ngram"):
            g.generate("hi", max_new_tokens=4, **bad)

    class LastLogitsOnly:           # a session that gives the last token's logits only, as the CPU program does
        def __init__(self, inner):
            self.inner, self.max_seq_len, self.vocab_size = inner, inner.max_seq_len, inner.vocab_size
            self.reset, self.rewind, self.feed = inner.reset, inner.rewind, inner.feed

        @property
        def position(self):
            return self.inner.position

    last_only = Generator(LastLogitsOnly(g.session), g.tokenizer, backend="cpu")
    assert last_only.generate("hi", max_new_tokens=3, stop_on_eos=False).stats.generated_tokens == 3
    with pytest.raises(InputError, match="the cpu backend gives only the last token's") as e:
        last_only.generate("hi", max_new_tokens=3, prompt_lookup=4)
    assert "--backend htp-sim" in e.value.fix
