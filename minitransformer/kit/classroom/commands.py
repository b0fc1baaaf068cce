"""``minitransformer classroom make | grade | autograder | list | bugs``: assignments made from the core, their
grading (one submission or a class), Gradescope's autograder; the command line (kit/cli/parser.py) registers it."""

import os
import re
import sys
import tempfile
from pathlib import Path

from minitransformer.kit.files import write_json
from minitransformer.kit.limits import option

from . import batch, exercises, grader, gradescope, maker
from .maker import PACKAGE


def add_classroom(sub) -> None:
    c = sub.add_parser("classroom", help="make an assignment from the core, or grade one",
                       description="make: write an assignment (the core with chosen backward bodies as stubs); "
                                   "grade: grade one, naming the mistake behind each failing gradient; "
                                   "list: the exercises; bugs: the mistake catalogue.")
    actions = c.add_subparsers(dest="action", metavar="ACTION", required=True)
    m = actions.add_parser("make", help="write an assignment folder for students (or --solutions for the teacher)")
    m.add_argument("dir", help="a new (or empty) folder")
    m.add_argument("--exercises", help="comma-separated names (default: every backward exercise); see `list`")
    m.add_argument("--solutions", action="store_true", help="keep the reference bodies: the teacher's copy")
    m.add_argument("--reveal", metavar="PARTS", help="parts (e.g. 1,2) whose reference bodies the folder holds, once "
                                                     "their deadline has passed (default: every part not handed out "
                                                     "is stubbed)")
    g = actions.add_parser("grade", help="grade an assignment folder, one submission, or a whole class",
                           description="DIR is an assignment folder (graded in place), one student's submission (a "
                                       "folder, a zip, a transformer/ folder or its loose files), or a folder of "
                                       "submissions, one folder or zip per student (needs --assignment).")
    g.add_argument("dir", help="an assignment folder, one submission, or a folder of submissions")
    g.add_argument("--assignment", help="the teacher's folder `make` wrote: its exercises are graded, each "
                                        "submission's files written into a fresh copy of it")
    g.add_argument("--json", dest="json_path", help="write the results here in Gradescope's results.json format")
    g.add_argument("--csv", dest="csv_path", help="a class: write the gradebook (student, total, max, the points of "
                                                  "each exercise, flags) as CSV for Canvas or Moodle")
    g.add_argument("--feedback", help="a class: write one Markdown feedback file per student into this folder")
    g.add_argument("--results", help="a class: the folder each student's result is stored in as it comes (default "
                                     "SUBMISSIONS-graded/); a rerun grades only what is not there yet")
    g.add_argument("--only", metavar="NAME", help="a class: grade this student again, alone")
    option(g, "--workers", "students graded at once (a class), or exercises (one submission) (default 2)",
           default=min(2, os.cpu_count() or 1))
    a = actions.add_parser("autograder", help="write Gradescope's autograder zip for an assignment",
                           description="The zip Gradescope takes: setup.sh installs this package from a wheel inside, "
                                       "run_autograder grades the student's upload against a fresh copy of the "
                                       "assignment with a hidden seed and writes results.json.")
    a.add_argument("dir", help="the assignment folder `make` wrote")
    a.add_argument("-o", "--output", required=True, help="the zip to write (e.g. autograder.zip)")
    a.add_argument("--visibility", choices=list(gradescope.WHEN), default="visible",
                   help="when students see the diagnoses (scores show at once); default visible")
    a.add_argument("--wheel", help="a wheel of this package to put in the zip (default: built from its source tree)")
    for p in (g, a):
        option(p, "--seed", "seed of the hidden inputs (default: drawn, and printed for the teacher)")
        option(p, "--timeout", "seconds each exercise may take (default 30)", default=30.0)
        p.add_argument("--diagnoses", choices=["what", "fix"], default="what",
                       help="what: name the mistake and where it is (before the deadline); fix: say how to fix it")
    actions.add_parser("list", help="the exercises, part by part, with a sentence each")
    actions.add_parser("bugs", help="the mistake catalogue: what the grader recognises, and what no check can see")
    c.set_defaults(run=cmd_classroom)


def cmd_classroom(args) -> int:
    if args.action == "list":
        for part, title in exercises.PARTS.items():
            print(f"part {part}: {title}")
            for e in [*exercises.EXERCISES.values(), exercises.TRAIN]:
                if e.part == part:
                    print(f"  {e.name:<22} {e.sentence}")
        print(f"`make` hands out the backward exercises unless --exercises says otherwise; {len(exercises.CATALOGUE)} "
              f"mistakes in the catalogue (`bugs`)")
    elif args.action == "bugs":
        print(exercises.catalogue_text())
    elif args.action == "make":
        chosen = maker.make(args.dir, args.exercises, args.solutions, args.reveal)
        print(f"wrote {'the solutions to ' if args.solutions else ''}{len(chosen)} exercises into {args.dir}: "
              f"{', '.join(e.name for e in chosen)}; the student starts with {Path(args.dir) / 'README.md'}")
    elif args.action == "autograder":
        config = gradescope.build(args.dir, args.output, args.seed, args.visibility, args.diagnoses, args.timeout,
                                  args.wheel)
        print(f"wrote {args.output}: upload it as the autograder; hidden seed {config['seed']}, diagnoses "
              f"{config['diagnoses']}, shown {gradescope.WHEN[args.visibility]}")
    else:
        return grade(args)
    return 0


def grade(args) -> int:
    path, options = Path(args.dir), {"seed": args.seed, "diagnoses": args.diagnoses, "time_limit": args.timeout}
    if args.assignment is None and (path / "assignment.json").is_file():         # a whole assignment, in place
        results = grader.grade(path, None, workers=args.workers, **options)
    elif path.is_file() or path.name == PACKAGE or (path / PACKAGE).is_dir() or any(path.glob("*.py")):  # a submission
        with tempfile.TemporaryDirectory(prefix="minitransformer-assignment-") as tmp:
            assignment = args.assignment or inferred(path, Path(tmp) / "hw")
            results = batch.grade_one(path, assignment, workers=args.workers, **options)
        if args.assignment is None:
            print("graded against a fresh assignment of the exercises its files name; give --assignment to choose")
    elif args.assignment is None:
        raise FileNotFoundError(f"classroom grade: {path} holds no assignment and no submission; to grade a class (a "
                                f"folder or zip per student) give --assignment, the folder `classroom make` wrote")
    else:
        return grade_class(args, path, options)
    print(results.pop("scorecard", None) or "\n".join(f"{t['name']:<28} {t['score']:>3}/{t['max_score']:<3} "
                                                     f"{t['status']}" for t in results["tests"]))
    print(f"score {results['score']}/{sum(t['max_score'] for t in results['tests'])}, {results['output']}")
    for line in [*results.get("notes", []), *batch.flagged(results)]:
        print(f"note: {line}")
    for test in (t for t in results["tests"] if t["score"] < t["max_score"]):
        print(f"\n{test['name']}:\n{test['output']}")
    if args.json_path:
        write_json(args.json_path, results, "Gradescope results")
    return 0


def grade_class(args, path: Path, options: dict) -> int:
    graded = batch.grade_class(path, args.assignment, args.results, workers=args.workers, only=args.only, **options)
    handed_out, _ = batch.manifest(args.assignment)
    for student, record in graded.items():
        if record["results"].get("flags", {}).get("submission") or record.get("key") is None:
            print(f"{student}: {record['results']['output']}", file=sys.stderr)
    scores = [r["results"]["score"] for r in graded.values()]
    print(f"{len(graded)} students graded, mean {sum(scores) / max(1, len(scores)):.1f} points; each result in "
          f"{args.results or path.with_name(path.name + '-graded')}")
    if args.csv_path:
        batch.gradebook(args.csv_path, graded, handed_out)
    if args.feedback:
        batch.write_feedback(args.feedback, graded)
    return 0


def inferred(source, directory) -> Path:
    """An assignment made in `directory` for a submission handed back alone: the exercises its files name in their
    'EXERCISE name (part N)' hints, every backward exercise if none."""
    found, _, _ = batch.collect(source, batch.graded_files(list(exercises.EXERCISES.values())))
    if not found:
        raise FileNotFoundError(f"classroom grade: {source} holds no assignment (no assignment.json) and no file of "
                                f"one (transformer/layers/linear.py, ...); a class or a submission needs --assignment")
    named = {m for text in found.values() for m in re.findall(r"EXERCISE (\S+) \(part", text.decode(errors="replace"))}
    maker.make(directory, [n for n in exercises.EXERCISES if n in named] or None)
    return Path(directory)
