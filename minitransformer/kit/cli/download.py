"""``minitransformer download``: the Multi30k task-1 files, where ``train --task multi30k`` reads them."""

from __future__ import annotations

from minitransformer.kit.data import datasets


def cmd_download(args) -> int:
    directory = datasets.download_multi30k(args.dir)
    print(f"Multi30k files are in {directory}")
    return 0
