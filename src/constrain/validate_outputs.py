# Checks structured outputs with independent validators: each line of the file argv[1] is
# {"kind", "spec", "text"}; "schema" validates json.loads(text) against the JSON schema spec
# (Python's jsonschema), "regex" fullmatches spec (Python's re), "object" must load as a dict.
# Prints one line per failure, then "checked N failed F"; exits 1 when any failed.
import json, re, sys, jsonschema
bad = 0
for line in open(sys.argv[1]):
    c = json.loads(line)
    try:
        if c["kind"] == "schema":
            jsonschema.validate(json.loads(c["text"]), json.loads(c["spec"]))
        elif c["kind"] == "regex":
            assert re.fullmatch(c["spec"], c["text"], re.S) is not None, "no full match"
        else:
            assert isinstance(json.loads(c["text"]), dict), "not an object"
    except Exception as e:
        bad += 1
        print("FAIL", repr(c["text"]), "against", c["spec"], ":", str(e).splitlines()[0])
print("checked", sum(1 for _ in open(sys.argv[1])), "failed", bad)
sys.exit(1 if bad else 0)
