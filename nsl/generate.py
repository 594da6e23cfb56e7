"""Generates text from a run's latest checkpoint, printing each token as it is decoded.

`python -m nsl.generate --run=RUN_DIR --prompt=TEXT [--max_new_tokens=64] [--temperature=0]
[--top_k=0] [--top_p=1] [--seed=0] [--speculative]`. The prompt is encoded with the run's
tokenizer (the copy in RUN_DIR/tokenizer, `nsl.data.rundata`; a run recorded without one: its
data directory; or `--data`), the continuation goes to stdout and the counts to stderr. Decoding
stops at the end-of-document token unless `--ignore_eos`.

Every family that decodes runs its own cached decoder, asked for through its `Decoder`
(nsl/models/decoder.py, docs/guide/decoding.md#generate): one prefill, then one compiled step per
token, each token printed as it comes (the standard trunk, SPS, NextLat and MTP through the shared
KV cache `nsl.decode`; the double decoder with the prompt as context and the continuation as one
block), or one compiled loop whose text is printed when it ends (LIFT's own-state decoder; the
self-speculative rounds of a decoder with a draft model, `--speculative`,
docs/papers/nextlat.md#speculative-decoding). Sampling is `nsl.decode.sample` at temperature T after `nsl.decode.truncate`
(top-k, then top-p); temperature 0 is greedy, the same tokens as `Family.generate`.
"""

from __future__ import annotations

import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from nsl import decode
from nsl.errors import ArgumentParser, ConfigError, cli_main


def parse_args(argv):
  p = ArgumentParser(prog="python -m nsl.generate", description=__doc__.split("\n")[0])
  p.add_argument("--run", required=True, help="the run directory (config.json, checkpoints/)")
  p.add_argument("--prompt", required=True, help="the text to continue")
  p.add_argument("--max_new_tokens", type=int, default=64, help="tokens to generate at most")
  p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; T > 0: sample from softmax(logits / T)")
  p.add_argument("--top_k", type=int, default=0, help="sample among the k most likely tokens (0: all; needs T > 0)")
  p.add_argument("--top_p", type=float, default=1.0,
                 help="sample among the most likely tokens holding probability p (1: all; needs T > 0)")
  p.add_argument("--seed", type=int, default=0, help="the sampling seed (the same seed, the same text)")
  p.add_argument("--speculative", action="store_true",
                 help="NextLat's self-speculative decoding (drafts from the latent dynamics model)")
  p.add_argument("--draft_len", type=int, default=None, help="drafted tokens per speculative round (default: the run's)")
  p.add_argument("--ignore_eos", action="store_true", help="keep generating after the end-of-document token")
  p.add_argument("--data", default=None, help="a data directory whose tokenizer to use instead of the run's own copy "
                                            "(WORKDIR/tokenizer; a run recorded without one: its data.path)")
  args = p.parse_args(argv)
  if args.max_new_tokens < 1:
    raise ConfigError(f"--max_new_tokens={args.max_new_tokens} must be at least 1")
  if not args.temperature >= 0:
    raise ConfigError(f"--temperature={args.temperature} must be >= 0 (0 is greedy)")
  if args.top_k < 0 or not 0 < args.top_p <= 1:
    raise ConfigError(f"--top_k={args.top_k} must be >= 0 and --top_p={args.top_p} in (0, 1]")
  if (args.top_k or args.top_p < 1) and args.temperature == 0:
    raise ConfigError("--top_k/--top_p choose among sampled tokens; add --temperature > 0 (greedy takes the top one)")
  if args.speculative and (args.top_k or args.top_p < 1):
    raise ConfigError("--speculative accepts drafts against the full distribution; drop --top_k/--top_p")
  if args.draft_len is not None and (not args.speculative or args.draft_len < 1):
    raise ConfigError(f"--draft_len={args.draft_len} needs --speculative and must be >= 1")
  return args


class Printer:
  """Streams decoded text: prints what the ids decode to beyond what is already printed, holding
  back a trailing incomplete UTF-8 character (decoded as U+FFFD until its last byte comes)."""

  def __init__(self, tokenizer, eos_id: int, stop_at_eos: bool, out=None):
    self.tok, self.eos, self.stop = tokenizer, eos_id, stop_at_eos
    self.out = out or sys.stdout
    self.ids, self.shown = [], 0

  def add(self, token: int) -> bool:
    """Takes one token; False when generation should stop (EOS, unless ignored)."""
    if token == self.eos and self.stop:
      return False
    self.ids.append(token)
    text = self.tok.decode(self.ids)
    end = len(text.rstrip("\ufffd"))
    if end > self.shown:
      self.out.write(text[self.shown:end])
      self.out.flush()
      self.shown = end
    return True

  def close(self) -> None:
    text = self.tok.decode(self.ids)
    self.out.write(text[self.shown:] + "\n")
    self.out.flush()


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def draw(logits_BV, key, temperature: float, top_k: int, top_p: float):
  """Tokens [B]: greedy at temperature 0, else `sample` of the truncated T-scaled logits."""
  if temperature == 0:
    return decode.sample(logits_BV, key, 0.0)
  return decode.sample(decode.truncate(logits_BV / temperature, top_k, top_p), key, 1.0)


def token_stream(decoder, params, prompt_1N, new: int):
  """A decoder's prefill and step (`nsl.models.decoder.Decoder`) a token at a time: yields each
  step's logits [1, V] and takes the token drawn from them (generator `send`)."""
  logits, state = decoder.prefill(params, prompt_1N, new)
  for k in range(new):
    token = yield logits
    if k + 1 < new:
      logits, state = decoder.step(params, state, token, k)


def stream(family, params, prompt, args, printer: Printer) -> dict:
  """Generates with the family's decoder and prints; returns the counts."""
  from nsl.models import decoder as decoders

  decoder = decoders.require(family, "nsl.generate")
  prompt_1N = jnp.asarray([prompt], jnp.int32)
  rng = jax.random.PRNGKey(args.seed)
  start = time.perf_counter()
  if args.speculative:
    from nsl import speculative

    tokens, stats = speculative.drafter(family)(params, args.draft_len, args.temperature).generate_speculative(
        prompt, args.max_new_tokens, rng)
    extra = {"rounds": stats["rounds"], "mean_tokens_per_round": float(np.mean(np.asarray(stats["accepted"]) + 1))}
  elif decoder.streams:
    emitted = _print_stream(decoder, params, prompt_1N, args, rng, printer)
    return {"new_tokens": emitted, "seconds": time.perf_counter() - start}
  else:  # one compiled loop (LIFT's own-state decoder): printed when it ends
    if args.top_k or args.top_p < 1:
      raise ConfigError(f"family {family.name!r} decodes in one compiled loop without top-k/top-p; drop them")
    tokens = decoder.generate(params, prompt_1N, args.max_new_tokens, temperature=args.temperature, rng=rng)[0][0]
    extra = {}
  emitted = 0
  for t in np.asarray(tokens).tolist():
    emitted += 1
    if not printer.add(int(t)):
      break
  printer.close()
  return {"new_tokens": emitted, "seconds": time.perf_counter() - start, **extra}


def _print_stream(decoder, params, prompt_1N, args, rng, printer: Printer) -> int:
  """Draws and prints each token as the decoder's step gives it; the number emitted."""
  new = args.max_new_tokens
  gen = token_stream(decoder, params, prompt_1N, new)
  logits, keys, emitted = next(gen), jax.random.split(rng, new), 0
  for k in range(new):
    token = draw(logits, keys[k], args.temperature, args.top_k, args.top_p)
    emitted += 1
    if not printer.add(int(token[0])):
      break
    if k + 1 < new:
      logits = gen.send(token)
  printer.close()
  return emitted


@cli_main
def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  from nsl import hf, runs
  from nsl.data import rundata

  config = hf.run_config(args.run, "--run")
  tok, eos_id, _ = rundata.tokenizer(args.run, config, args.data)
  prompt = tok.encode(args.prompt)
  if not prompt:
    raise ConfigError("--prompt is empty after tokenization; give some text to continue")
  _, family, params = runs.load_run(args.run, flag="--run")
  counts = stream(family, params, prompt, args, Printer(tok, eos_id, not args.ignore_eos))
  counts.update(prompt_tokens=len(prompt), family=family.name)
  print(json.dumps(counts, sort_keys=True), file=sys.stderr)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
