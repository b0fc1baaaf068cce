"""``minitransformer classroom make | grade | list | bugs``: assignments made from the core, and their grading."""

import os
from pathlib import Path

from minitransformer.kit import classroom
from minitransformer.kit.classroom.exercises import catalogue_text
from minitransformer.kit.files import write_json

from .common import option


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
    g = actions.add_parser("grade", help="grade an assignment folder; print the scorecard")
    g.add_argument("dir", help="the student's folder, as `make` wrote it")
    g.add_argument("--json", dest="json_path", help="write the results here in Gradescope's results.json format")
    option(g, "--seed", "seed of the random inputs (default 0)", default=0)
    option(g, "--timeout", "seconds each exercise may take (default 30)", default=30.0)
    option(g, "--workers", "exercises graded at once, each in its own process (default 2)",
           default=min(2, os.cpu_count() or 1))
    actions.add_parser("list", help="the exercises, part by part, with a sentence each")
    actions.add_parser("bugs", help="the mistake catalogue: what the grader recognises, and what no check can see")
    c.set_defaults(run=cmd_classroom)


def cmd_classroom(args) -> int:
    if args.action == "list":
        for part, title in classroom.PARTS.items():
            print(f"part {part}: {title}")
            for e in [*classroom.EXERCISES.values(), classroom.TRAIN]:
                if e.part == part:
                    print(f"  {e.name:<22} {e.sentence}")
        print(f"`make` hands out the backward exercises unless --exercises says otherwise; {len(classroom.CATALOGUE)} "
              f"mistakes in the catalogue (`bugs`)")
    elif args.action == "bugs":
        print(catalogue_text())
    elif args.action == "make":
        chosen = classroom.make(args.dir, args.exercises, args.solutions)
        print(f"wrote {'the solutions to ' if args.solutions else ''}{len(chosen)} exercises into {args.dir}: "
              f"{', '.join(e.name for e in chosen)}; the student starts with {Path(args.dir) / 'README.md'}")
    else:
        results = classroom.grade(args.dir, seed=args.seed, timeout=args.timeout, workers=args.workers)
        print(results.pop("scorecard"))
        print(f"score {results['score']}/{sum(t['max_score'] for t in results['tests'])}, {results['output']}")
        for test in results["tests"]:
            if test["score"] < test["max_score"]:
                print(f"\n{test['name']}:\n{test['output']}")
        if args.json_path:
            write_json(args.json_path, results, "Gradescope results")
    return 0
