"""Write Geometry3K as parquet files, one per split, with the columns of the hub copy `hiyouga/geometry3k`.

    python examples/data_preprocess/geo3k.py --local_dir data/geo3k                      # from the hub
    python examples/data_preprocess/geo3k.py --local_dir data/geo3k --intergps_dir DIR   # from the raw InterGPS dump

Columns: ``images`` (list of images, stored as ``{"bytes", "path"}`` structs that ``datasets`` reads back as images),
``problem`` (``"<image>"`` + the problem text), ``answer`` (the text of the correct choice), ``id``, ``choices``,
``ground_truth``. The InterGPS dump (e.g. ``examples/data/geometry3k_sample``) is split by each problem's
``data_type``. Then train with ``data.train_files: data/geo3k/train.parquet``.
"""

from __future__ import annotations

import argparse
import os

import datasets

from easyrl.data.intergps import load_intergps_geometry3k


def load_splits(source: str | None, intergps_dir: str | None) -> dict[str, datasets.Dataset]:
    """The splits to write: from the InterGPS folder if given, else ``datasets.load_dataset(source)``."""
    if intergps_dir is not None:
        return load_intergps_geometry3k(intergps_dir)
    try:
        return dict(datasets.load_dataset(source))
    except Exception as err:
        raise SystemExit(
            f"cannot load {source!r} from the hub ({type(err).__name__}: {err}); without network access pass "
            "--intergps_dir with the raw InterGPS Geometry3K folder (e.g. examples/data/geometry3k_sample)"
        ) from err


def main(argv: list[str] | None = None) -> dict[str, str]:
    """Run the CLI; returns ``{split: written parquet path}``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local_dir", required=True, help="output folder for <split>.parquet")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--source", default="hiyouga/geometry3k", help="hub dataset id (default: hiyouga/geometry3k)")
    group.add_argument("--intergps_dir", default=None, help="raw InterGPS folder of <id>/data.json + img_diagram.png")
    args = parser.parse_args(argv)

    splits = load_splits(args.source, args.intergps_dir)
    os.makedirs(args.local_dir, exist_ok=True)
    written = {}
    for split, dataset in splits.items():
        path = os.path.join(args.local_dir, f"{split}.parquet")
        dataset.to_parquet(path)
        written[split] = path
        print(f"{split}: {len(dataset)} rows -> {path}")
    return written


if __name__ == "__main__":
    main()
