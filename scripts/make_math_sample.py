"""Writes rlmesh/rl/tasks/data/gsm8k_sample.jsonl: grade-school word problems in GSM8K's format
(``question``; ``answer`` = worked steps, then ``#### <number>``), generated from templates by
this script, so the project ships a data set of its own (none of GSM8K's text).

    python scripts/make_math_sample.py            # deterministic: the same file every time
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena", "Mira", "Noor",
         "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tariq"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "shells", "stamps", "cards", "beads"]


def one(rng: random.Random) -> tuple[str, str]:
    n, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.randrange(6)
    if kind == 0:
        a, b = rng.randint(3, 40), rng.randint(2, 30)
        return (f"{n} has {a} {item}. A friend gives {n} {b} more. How many {item} does {n} have now?",
                f"{n} has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}.\n#### {a + b}")
    if kind == 1:
        a = rng.randint(20, 90)
        b = rng.randint(2, a - 1)
        return (f"{n} had {a} {item} and gave away {b}. How many {item} are left?",
                f"{n} has {a} - {b} = <<{a}-{b}={a - b}>>{a - b} {item} left.\n#### {a - b}")
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return (f"{n} buys {a} boxes of {item}. Each box holds {b} {item}. How many {item} does {n} buy?",
                f"{n} buys {a} * {b} = <<{a}*{b}={a * b}>>{a * b} {item}.\n#### {a * b}")
    if kind == 3:
        b, q = rng.randint(2, 9), rng.randint(2, 12)
        a = b * q
        return (f"{n} shares {a} {item} equally among {b} friends. How many {item} does each friend get?",
                f"Each friend gets {a} / {b} = <<{a}/{b}={q}>>{q} {item}.\n#### {q}")
    if kind == 4:
        price, count, paid = rng.randint(2, 9), rng.randint(2, 6), 0
        cost = price * count
        paid = cost + rng.randint(1, 20)
        return (f"{n} buys {count} {item} at ${price} each and pays with ${paid}. How much change does {n} get?",
                f"The {item} cost {count} * {price} = <<{count}*{price}={cost}>>{cost} dollars.\n"
                f"The change is {paid} - {cost} = <<{paid}-{cost}={paid - cost}>>{paid - cost} dollars.\n#### {paid - cost}")
    a, b, c = rng.randint(5, 30), rng.randint(5, 30), rng.randint(1, 10)
    return (f"{n} collects {a} {item} on Monday and {b} on Tuesday, then loses {c}. How many {item} does {n} have?",
            f"{n} collects {a} + {b} = <<{a}+{b}={a + b}>>{a + b} {item}.\n"
            f"After losing {c}, {n} has {a + b} - {c} = <<{a + b}-{c}={a + b - c}>>{a + b - c}.\n#### {a + b - c}")


def main(rows: int = 400, seed: int = 8) -> Path:
    rng = random.Random(seed)
    out = Path(__file__).resolve().parent.parent / "rlmesh" / "rl" / "tasks" / "data" / "gsm8k_sample.jsonl"
    seen: set[str] = set()
    with out.open("w") as f:
        while len(seen) < rows:
            q, a = one(rng)
            if q not in seen:
                seen.add(q)
                f.write(json.dumps({"question": q, "answer": a}) + "\n")
    return out


if __name__ == "__main__":
    print(main())
