"""Validates the documents that tests/sampling/grammar_json_schema_test.cpp sampled under JSON Schema grammars.

Usage: grammar_json_schema_check.py CASES.jsonl
Each line is {"schema": ..., "output": "<the generated text>"}. The output must parse as JSON and validate
against the schema with jsonschema's Draft 2020-12 validator (formats are annotations there, as by default;
the C++ checker covers them). Prints "N valid" and exits 0, or lists the failures and exits 1.
"""
import json
import sys

import jsonschema


def main(path):
    failures = []
    count = 0
    with open(path, encoding="utf-8") as cases:
        for number, line in enumerate(cases, 1):
            case = json.loads(line)
            count += 1
            try:
                document = json.loads(case["output"])
                jsonschema.Draft202012Validator(case["schema"]).validate(document)
            except (ValueError, jsonschema.ValidationError) as error:
                failures.append(f"case {number}: {error}\n  schema {json.dumps(case['schema'])}\n"
                                f"  output {case['output']!r}")
    if failures:
        print("\n".join(failures))
        print(f"{len(failures)} of {count} invalid")
        return 1
    print(f"{count} valid")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
