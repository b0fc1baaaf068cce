"""``minitransformer convert``: checkpoints of earlier versions (.npz) rewritten once as safetensors."""

from minitransformer.kit.running.npz import convert_npz


def add_convert(sub) -> None:
    c = sub.add_parser("convert", help="rewrite checkpoints of earlier versions (.npz) as safetensors",
                       description="Rewrite an .npz checkpoint of an earlier minitransformer as a .safetensors file "
                                   "beside it (or, given a run folder, each of its checkpoint*.npz files), so that "
                                   "translate, evaluate and train --resume read it. The old files are kept.")
    c.add_argument("path", help="an .npz checkpoint, or a run folder holding checkpoint.npz and checkpoint-<step>.npz")
    c.add_argument("--to", default=None, metavar="FILE",
                   help="the new file's name (default: the old one's, ending in .safetensors); not for a folder")
    c.set_defaults(run=cmd_convert)


def cmd_convert(args) -> int:
    for path in convert_npz(args.path, args.to):
        print(f"wrote {path}")
    return 0
