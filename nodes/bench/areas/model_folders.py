"""Model-folder listing speed on a large library: 10,000 files in 100 folders, half of them symlinked
from a store outside ``models/`` (plus a link cycle, which the walk must skip).

    python main.py bench model_folders [--folders 100] [--per-folder 100] [--repeats 5]

Prints, never asserts (absolute times on shared machines vary up to 3×): the cold listing (every
folder walked), the warm listing (cached: one ``stat`` per folder, no folder read), the listing after
one file was added (walked again), after ``refresh()`` (what ``/object_info`` does), and one
``resolve``. Medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from engine.folders import ModelFolders

PAST_NS = 1_700_000_000 * 10**9  # folders dated back: a just-modified folder is never trusted


def build_library(base: Path, folders: int, per_folder: int) -> Path:
    """``base/models`` with ``loras/setNNN`` folders; the odd ones are links into ``base/store``."""
    loras = base / "models" / "loras"
    loras.mkdir(parents=True)
    for i in range(folders):
        target = (base / "store" / f"set{i:03}") if i % 2 else (loras / f"set{i:03}")
        target.mkdir(parents=True)
        for j in range(per_folder):
            (target / f"lora_{j:03}.safetensors").touch()
        if i % 2:
            (loras / f"set{i:03}").symlink_to(target, target_is_directory=True)
    return base / "models"


def date_back(base: Path) -> None:
    for dirpath, _, _ in os.walk(base):
        os.utime(dirpath, ns=(PAST_NS, PAST_NS))


def median_ms(
    action: Callable[[], object], repeats: int, before: Callable[[], object] = lambda: None
) -> float:
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="main.py bench model_folders", description=__doc__.splitlines()[0])
    parser.add_argument("--folders", type=int, default=100)
    parser.add_argument("--per-folder", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        models_dir = build_library(base, args.folders, args.per_folder)
        (base / "store" / "set001" / "loop").symlink_to(
            base / "store" / "set001", target_is_directory=True
        )  # a cycle
        date_back(base)
        models = ModelFolders(models_dir)
        count = len(models.list("loras"))
        cold = median_ms(lambda: models.list("loras"), args.repeats, before=models.refresh)
        models.list("loras")
        warm = median_ms(lambda: models.list("loras"), args.repeats)
        added = iter(range(args.repeats))

        def add_one() -> None:
            k = next(added) + 1
            (base / "store" / "set001" / f"new_{k}.safetensors").touch()
            os.utime(base / "store" / "set001", ns=(PAST_NS, PAST_NS + k))  # a new time each: a change

        changed = median_ms(lambda: models.list("loras"), args.repeats, before=add_one)
        grown = len(models.list("loras")) - count
        last = f"set{args.folders - 1:03}/lora_{args.per_folder - 1:03}.safetensors"  # set099/lora_099 by default
        resolve = median_ms(lambda: models.resolve("loras", last), args.repeats)
        print(f"model folders: {count} files in {args.folders} folders (half symlinked, one link cycle)")
        print(f"  cold listing (refresh, then list)  {cold:8.2f} ms")
        print(
            f"  warm listing (cached)              {warm:8.2f} ms   cold / warm {cold / max(warm, 1e-6):.0f}x"
        )
        print(f"  listing after one file was added   {changed:8.2f} ms   ({grown} added files listed)")
        print(f"  resolve one name (cached)          {resolve:8.3f} ms")


if __name__ == "__main__":
    main()
