#!/usr/bin/env python3
"""Turn the unpacked Debian packages into the training corpus.

Usage: build_corpus.py WORKDIR REPO_ROOT

WORKDIR holds x/PKG/ (each package unpacked with dpkg-deb -x), as made by
prepare_corpus.sh.  Writes WORKDIR/out/{train,val}.jsonl and stats.json, and
the committed held-out sets REPO_ROOT/tests/data/eval/ and tests/data/calib/.

Every document is split into ~4 KB chunks at line boundaries; the split of a
chunk (eval / calib / val / train) is a pure function of its source, path and
chunk index, so the result does not depend on file-system order.  Exact
duplicates (same text) are removed before chunking.
"""
import glob
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import htmltext  # noqa: E402
import rdata  # noqa: E402

CHUNK = 4096
# held-out budgets in bytes, per category
EVAL_BYTES = {"code-go": 80_000, "code-python": 80_000, "prose-lit": 80_000, "prose-docs": 80_000}
CALIB_BYTES = {"code-go": 25_000, "code-python": 25_000, "prose-lit": 25_000, "prose-docs": 25_000}
VAL_FRACTION = 0.01
# cap on bytes per category kept for training (None: keep all); keeps the
# mix near half code, half prose
TRAIN_CAP = {"code-go": 30_000_000, "code-python": 20_000_000}

KJV_BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
    "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra",
    "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
    "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
    "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
    "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians",
    "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon",
    "Hebrews", "James", "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude",
    "Revelation",
]
AUSTEN = {
    "sensesensibility": "Sense and Sensibility", "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park", "emma": "Emma", "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}


def clean(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    text = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", "", text)
    return text


def read_utf8(path):
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def code_ok(text, max_bytes=256_000):
    if not text.strip() or len(text) > max_bytes:
        return False
    lines = text.split("\n")
    if max(len(line) for line in lines) > 1000:
        return False
    if len(text) / len(lines) > 100:
        return False
    return True


# --------------------------------------------------------------- sources
def src_go(x):
    root = os.path.join(x, "golang-1.19-src/usr/share/go-1.19/src")
    for path in sorted(glob.glob(root + "/**/*.go", recursive=True)):
        rel = os.path.relpath(path, root)
        if "/testdata/" in "/" + rel or not os.path.isfile(path):
            continue
        text = read_utf8(path)
        if text is None or not code_ok(text):
            continue
        if "Code generated" in text[:2000] and "DO NOT EDIT" in text[:2000]:
            continue
        yield "golang-1.19-src", "go/src/" + rel, text


def src_python(x):
    for pkg in ("libpython3.11-minimal", "libpython3.11-stdlib", "libpython3.11-testsuite"):
        root = os.path.join(x, pkg, "usr/lib/python3.11")
        for path in sorted(glob.glob(root + "/**/*.py", recursive=True)):
            if not os.path.isfile(path):
                continue
            text = read_utf8(path)
            if text is None or not code_ok(text):
                continue
            yield pkg, "python3.11/" + os.path.relpath(path, root), text
    root = os.path.join(x, "python3-django/usr/lib/python3/dist-packages")
    for path in sorted(glob.glob(root + "/django/**/*.py", recursive=True)):
        text = read_utf8(path)
        if text is None or not code_ok(text):
            continue
        yield "python3-django", os.path.relpath(path, root), text


def _html_tree(x, pkg, sub, skip_dirs=()):
    root = os.path.join(x, pkg, sub)
    for path in sorted(glob.glob(root + "/**/*.html", recursive=True)):
        rel = os.path.relpath(path, root)
        if any(rel.startswith(d + "/") for d in skip_dirs):
            continue
        base = os.path.basename(rel)
        if base in ("genindex.html", "search.html", "py-modindex.html", "bookindex.html",
                    "sitemap.html", "keyword_index.html", "toc.html", "doc_keyword_index.html",
                    "doc_backlink_crossref.html", "doc_pagelink_crossref.html",
                    "doc_target_crossref.html", "releaselog"):
            continue
        if base.startswith("genindex"):
            continue
        raw = read_utf8(path)
        if raw is None:
            with open(path, "rb") as f:
                raw = f.read().decode("latin-1")
        text = htmltext.html_to_text(raw)
        if len(text) < 200:
            continue
        yield pkg, rel, text


def src_docs(x):
    root = os.path.join(x, "python3.11-doc/usr/share/doc/python3.11/html/_sources")
    for path in sorted(glob.glob(root + "/**/*.txt", recursive=True)):
        text = read_utf8(path)
        if text:
            yield "python3.11-doc", "python3.11-doc/" + os.path.relpath(path, root), text
    yield from _html_tree(x, "python-django-doc", "usr/share/doc/python-django-doc/html",
                          skip_dirs=("_modules", "_static", "_images", "_sources"))
    yield from _html_tree(x, "postgresql-doc-15", "usr/share/doc/postgresql-doc-15/html")
    yield from _html_tree(x, "sqlite3-doc", "usr/share/doc/sqlite3",
                          skip_dirs=("images",))
    yield from _html_tree(x, "golang-1.19-doc", "usr/share/doc/golang-1.19-doc/html")


def src_lit(x):
    # King James Bible: the package ships a compressed text; the bible-kjv
    # package's own program decodes it, one verse a line ("Ge1:1 In the ...").
    exe = os.path.join(x, "bible-kjv/usr/bin/bible")
    data = os.path.join(x, "bible-kjv-text/usr/lib")
    out = subprocess.run([exe, "-p", data, "-f", "gen1:1-rev22:21"], stdin=subprocess.DEVNULL,
                         capture_output=True, check=True).stdout.decode("utf-8")
    books, order = {}, []
    for line in out.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            continue
        abbr = m.group(1)
        if abbr not in books:
            books[abbr] = []
            order.append(abbr)
        books[abbr].append("%s:%s %s" % (m.group(2), m.group(3), m.group(4)))
    assert len(order) == 66, len(order)
    for abbr, name in zip(order, KJV_BOOKS):
        text = "The Book of %s\n\n" % name if not name[0].isdigit() else "%s\n\n" % name
        yield "bible-kjv-text", "kjv/" + name, text + "\n".join(books[abbr]) + "\n"

    db = rdata.read_lazyload_db(os.path.join(
        x, "r-cran-janeaustenr/usr/lib/R/site-library/janeaustenr/data/Rdata"))
    for key, title in AUSTEN.items():
        lines = [s if s is not None else "" for s in db[key].value]
        text = "\n".join(lines).strip() + "\n"
        text = re.sub(r"\n{3,}", "\n\n", text)
        yield "r-cran-janeaustenr", "austen/" + title, text

    with gzip.open(os.path.join(x, "dict-devil/usr/share/dictd/devil.dict.dz"), "rt",
                   encoding="utf-8", errors="replace") as f:
        devil = f.read()
    # the first entries are the dictd headers (00-database-*); the text proper follows
    m = re.search(r"^A\s*$", devil, flags=re.M)
    if m:
        devil = devil[m.start():]
    yield "dict-devil", "devil/The Devil's Dictionary", devil

    with gzip.open(os.path.join(x, "jargon-text/usr/share/doc/jargon-text/jargon.txt.gz"), "rt",
                   encoding="latin-1") as f:
        yield "jargon-text", "jargon/The Jargon File", f.read()


SOURCES = [("code-go", src_go), ("code-python", src_python),
           ("prose-docs", src_docs), ("prose-lit", src_lit)]


# --------------------------------------------------------------- splitting
def chunks(text):
    """Split at line ends into pieces of about CHUNK bytes, preferring blank lines."""
    out, cur, size = [], [], 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        size += len(line)
        if (size >= CHUNK and line.strip() == "") or size >= 2 * CHUNK:
            out.append("".join(cur))
            cur, size = [], 0
    if cur:
        if out and size < CHUNK // 4:
            out[-1] += "".join(cur)
        else:
            out.append("".join(cur))
    return out


def unit_hash(*parts):
    h = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2 ** 64


def main():
    work, repo = sys.argv[1], sys.argv[2]
    x = os.path.join(work, "x")
    out_dir = os.path.join(work, "out")
    os.makedirs(out_dir, exist_ok=True)

    seen = set()
    docs = []                 # (category, pkg, path, [chunks])
    stats = {"dups": 0, "sources": {}}
    for cat, fn in SOURCES:
        for pkg, path, text in fn(x):
            text = clean(text)
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            if digest in seen:
                stats["dups"] += 1
                continue
            seen.add(digest)
            docs.append((cat, pkg, path, chunks(text)))
            s = stats["sources"].setdefault(pkg, {"docs": 0, "bytes": 0, "category": cat})
            s["docs"] += 1
            s["bytes"] += len(text.encode("utf-8"))

    # assign held-out chunks: per category, lowest hashes first
    split = {}
    for cat in EVAL_BYTES:
        units = []
        for di, (c, pkg, path, ch) in enumerate(docs):
            if c != cat:
                continue
            for ci, piece in enumerate(ch):
                units.append((unit_hash(pkg, path, str(ci)), di, ci, len(piece.encode("utf-8"))))
        units.sort()
        budget = [("eval", EVAL_BYTES[cat]), ("calib", CALIB_BYTES[cat])]
        k = 0
        for name, limit in budget:
            used = 0
            while used < limit and k < len(units):
                h, di, ci, n = units[k]
                split[(di, ci)] = name
                used += n
                k += 1
        for h, di, ci, n in units[k:]:
            split[(di, ci)] = "val" if h >= 1.0 - VAL_FRACTION else "train"

    # training cap per category (keeps whole documents, chosen by hash)
    for cat, cap in TRAIN_CAP.items():
        order = sorted((unit_hash(d[1], d[2]), di) for di, d in enumerate(docs) if d[0] == cat)
        used = 0
        for h, di in order:
            n = sum(len(p.encode("utf-8")) for ci, p in enumerate(docs[di][3])
                    if split[(di, ci)] == "train")
            if used + n > cap:
                for ci in range(len(docs[di][3])):
                    if split[(di, ci)] == "train":
                        split[(di, ci)] = "unused"
            else:
                used += n

    # Calibration text shares no source file with the evaluation text: a quantizer calibrated on
    # one part of a file would flatter its own scores on another.  Candidates are the chunks of
    # files outside the evaluation set that training never reads (the calib, val and unused
    # splits), lowest hash first, so calib keeps every chunk it had whose file is not evaluated;
    # a val chunk chosen stays in val too, and train and val are exactly as before.
    eval_files = {(docs[di][1], docs[di][2]) for (di, ci), s in split.items() if s == "eval"}
    calib_units = set()
    for cat in CALIB_BYTES:
        pool = sorted((unit_hash(pkg, path, str(ci)), di, ci, len(piece.encode("utf-8")))
                      for di, (c, pkg, path, ch) in enumerate(docs) if c == cat and (pkg, path) not in eval_files
                      for ci, piece in enumerate(ch) if split[(di, ci)] in ("calib", "val", "unused"))
        used = 0
        for h, di, ci, n in pool:
            if used >= CALIB_BYTES[cat]:
                break
            calib_units.add((di, ci))
            used += n
    for key, s in split.items():
        if s == "calib" and key not in calib_units:
            split[key] = "unused"

    held = {"eval": {}, "calib": {}}
    sizes = {}
    with open(os.path.join(out_dir, "train.jsonl"), "w") as ftr, \
            open(os.path.join(out_dir, "val.jsonl"), "w") as fva:
        for di, (cat, pkg, path, ch) in enumerate(docs):
            run, run_split = [], None

            def flush():
                if run and run_split in ("train", "val"):
                    rec = {"cat": cat, "pkg": pkg, "path": path, "text": "".join(run)}
                    (ftr if run_split == "train" else fva).write(json.dumps(rec) + "\n")

            for ci, piece in enumerate(ch):
                s = split[(di, ci)]
                key = (s, cat)
                sizes[key] = sizes.get(key, 0) + len(piece.encode("utf-8"))
                if s == "eval":
                    held[s].setdefault(cat, []).append((pkg, path, ci, piece))
                if (di, ci) in calib_units:
                    held["calib"].setdefault(cat, []).append((pkg, path, ci, piece))
                    if s != "calib":  # (counted above when it was a calib chunk already)
                        sizes[("calib", cat)] = sizes.get(("calib", cat), 0) + len(piece.encode("utf-8"))
                if s != run_split:
                    flush()
                    run, run_split = [], s
                run.append(piece)
            flush()

    # committed held-out files
    groups = {
        "eval": {"code.txt": ["code-go", "code-python"], "prose.txt": ["prose-lit", "prose-docs"]},
        "calib": {"calib.txt": ["code-go", "code-python", "prose-lit", "prose-docs"]},
    }
    for name, files in groups.items():
        d = os.path.join(repo, "tests/data", name)
        os.makedirs(d, exist_ok=True)
        manifest = ["file\tbyte_offset\tbytes\tcategory\tpackage\tsource_path\tchunk"]
        for fname, cats in files.items():
            parts, off = [], 0
            for cat in cats:
                for pkg, path, ci, piece in held[name].get(cat, []):
                    piece = piece.strip("\n") + "\n\n"
                    n = len(piece.encode("utf-8"))
                    manifest.append("\t".join([fname, str(off), str(n), cat, pkg, path, str(ci)]))
                    parts.append(piece)
                    off += n
            with open(os.path.join(d, fname), "w") as f:
                f.write("".join(parts))
        with open(os.path.join(d, "MANIFEST.tsv"), "w") as f:
            f.write("\n".join(manifest) + "\n")

    stats["split_bytes"] = {"%s/%s" % k: v for k, v in sorted(sizes.items())}
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
    print(json.dumps(stats, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
