"""Which rewards score a row, from the recipe's list of specs:

    auto                  DARE's default for the row's data source (``score_for_source``)
    NAME  or  NAME:W      a registered reward (weight W, default 1) for every row
    SOURCE=NAME[:W]       only for rows whose data source is SOURCE

A row's score is the weighted sum of the rewards that apply to it (its source's entries first, then the general
ones); accuracy comes from the first. ``check`` fails early for a data source that nothing scores. Rewards get the
row's ``extra_info`` with the prompt messages added under ``"prompt"`` (the code reward takes HumanEval's code
prompt from there).
"""

from concurrent.futures import ThreadPoolExecutor

from . import RewardResult, code, combine, get_reward, score_for_source

BLOCKING = {"code"}  # rewards that wait on a sandboxed subprocess


def _countdown_row(truth, extra) -> str | None:
    try:
        float(truth)
    except (TypeError, ValueError):
        return f"its target {truth!r} is not a number"
    return None if (extra or {}).get("numbers") else "it has no extra_info.numbers"


# what a reward needs of a row, for the rewards that need more than an answer: why it cannot score it, or None
NEEDS = {"code": lambda truth, extra: code.test_problem(str(truth), extra or {}),
         "countdown": _countdown_row,
         "sudoku": lambda truth, extra: None if str(truth).strip().isdigit() and len(str(truth).strip()) == 16
         else f"its solution {str(truth)[:40]!r} is not 16 digits"}


def _parse(spec: str) -> tuple[str | None, str, float]:
    source, _, rest = spec.rpartition("=")
    name, _, weight = rest.partition(":")
    try:
        value = float(weight) if weight else 1.0
    except ValueError:
        raise ValueError(f"reward spec {spec!r}: weight {weight!r} is not a number") from None
    if name != "auto":
        get_reward(name)  # unknown names fail here, with the list of known ones
    return source or None, name, value


class RewardRouter:
    def __init__(self, specs: list[str]):
        if not specs:
            raise ValueError("no rewards given; use e.g. ['auto'] or ['math', 'format_soft:0.1']")
        self.specs = [_parse(s) for s in specs]
        self._cache = {}

    def entries(self, source: str, task: str | None = None) -> list[tuple[str, float]]:
        chosen = [s for s in self.specs if s[0] == source] + [s for s in self.specs if s[0] is None]
        return [(score_for_source(source, task) if name == "auto" else name, w) for _, name, w in chosen]

    def check(self, sources) -> None:
        missing = sorted(s for s in set(sources) if not self.entries(s))
        if missing:
            raise ValueError(f"data source(s) {missing} have no reward; add SOURCE=NAME entries or an entry for "
                             f"every row (e.g. 'auto') to the rewards list {[self._show(s) for s in self.specs]}")

    def check_rows(self, rows: list[dict], sample: int = 8) -> None:
        """Fail early when a chosen reward cannot score any of the first ``sample`` rows of a data source (e.g.
        ``code`` on math rows: every reward would be 0)."""
        by_source = {}
        for row in rows:
            by_source.setdefault(row["data_source"], []).append(row)
        for source, group in by_source.items():
            for name, _ in self.entries(source, (group[0].get("extra_info") or {}).get("task")):
                if name not in NEEDS:
                    continue
                reasons = [NEEDS[name](r["ground_truth"], r.get("extra_info")) for r in group[:sample]]
                if all(reasons):
                    raise ValueError(f"reward {name!r} cannot score the {source!r} rows: {reasons[0]} (checked "
                                     f"{len(reasons)} rows); choose a reward for them, e.g. {source}=auto")

    def __call__(self, completion: str, row: dict) -> RewardResult:
        extra = row.get("extra_info") or {}
        key = (row["data_source"], extra.get("task"))
        if key not in self._cache:
            entries = self.entries(*key)
            if not entries:
                self.check([key[0]])
            self._cache[key] = combine(entries)
        return self._cache[key](completion, row["ground_truth"], {"prompt": row.get("prompt"), **extra})

    def score(self, completions: list[str], rows: list[dict], workers: int = 8) -> list[RewardResult]:
        """Score many completions. Rows whose rewards wait on subprocesses (code) run in ``workers`` threads; the
        rest run in the calling thread, where math_verify's timeouts work (they need the main thread's signals)."""
        task = lambda r: (r.get("extra_info") or {}).get("task")
        blocking = [i for i, r in enumerate(rows)
                    if any(name in BLOCKING for name, _ in self.entries(r["data_source"], task(r)))]
        results = [None] * len(rows)
        if blocking:
            with ThreadPoolExecutor(max(1, workers)) as pool:
                scored = pool.map(lambda i: self(completions[i], rows[i]), blocking)
                for i, result in zip(blocking, scored, strict=True):
                    results[i] = result
        for i, row in enumerate(rows):
            if results[i] is None:
                results[i] = self(completions[i], row)
        return results

    @staticmethod
    def _show(spec):
        source, name, weight = spec
        return f"{source + '=' if source else ''}{name}{'' if weight == 1.0 else f':{weight:g}'}"
