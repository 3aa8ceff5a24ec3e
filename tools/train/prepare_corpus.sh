#!/usr/bin/env bash
# Fetch the training corpus from Debian's archive (bookworm) and build it.
#
#   tools/train/prepare_corpus.sh [WORKDIR]      (default: .corpus, run as root or with apt access)
#
# Every package is fetched by name and exact version with `apt-get download`,
# unpacked with `dpkg-deb -x`, and its sha256 written to WORKDIR/provenance.tsv
# (models/README.md lists them).  Then build_corpus.py extracts, deduplicates
# and splits the text: WORKDIR/out/{train,val}.jsonl (not committed) and
# tests/data/eval/, tests/data/calib/ (committed).  Next steps:
# train_tokenizer.py, tokenize_corpus.py, pack.sh (see models/README.md).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
work="$(realpath -m "${1:-$repo/.corpus}")"

# package=version   licence of the text used
PACKAGES=(
  "golang-1.19-src=1.19.8-2"                 # BSD-3-Clause (Go)
  "golang-1.19-doc=1.19.8-2"                 # BSD-3-Clause (Go)
  "libpython3.11-minimal=3.11.2-6+deb12u9"   # PSF-2.0
  "libpython3.11-stdlib=3.11.2-6+deb12u9"    # PSF-2.0
  "libpython3.11-testsuite=3.11.2-6+deb12u9" # PSF-2.0
  "python3.11-doc=3.11.2-6+deb12u9"          # PSF-2.0
  "python3-django=3:3.2.25-0+deb12u7"        # BSD-3-Clause
  "python-django-doc=3:3.2.25-0+deb12u7"     # BSD-3-Clause
  "postgresql-doc-15=15.20-0+deb12u1"        # PostgreSQL (BSD-like)
  "sqlite3-doc=3.40.1-2+deb12u2"             # public domain
  "bible-kjv-text=4.38"                      # public domain text
  "bible-kjv=4.38"                           # only its decoder program is run (not in the corpus)
  "r-cran-janeaustenr=1.0.0-1"               # MIT; the novels are public domain
  "dict-devil=1.0-13.1"                      # public domain
  "jargon-text=4.4.7-4.1"                    # public domain
)

mkdir -p "$work/debs" "$work/x"
cd "$work/debs"
if [ -z "${SKIP_APT_UPDATE:-}" ]; then apt-get update -qq; fi
for pv in "${PACKAGES[@]}"; do
  name="${pv%%=*}"
  if ! ls "${name}"_*.deb >/dev/null 2>&1; then
    apt-get download -q "$pv"
  fi
done

: > "$work/provenance.tsv"
for pv in "${PACKAGES[@]}"; do
  name="${pv%%=*}"; ver="${pv#*=}"
  deb="$(ls "${name}"_*.deb)"
  got="$(dpkg-deb -f "$deb" Version)"
  [ "$got" = "$ver" ] || { echo "version mismatch for $name: $got != $ver" >&2; exit 1; }
  printf '%s\t%s\t%s\t%s\n' "$name" "$ver" "$(sha256sum "$deb" | cut -d' ' -f1)" "$deb" >> "$work/provenance.tsv"
  rm -rf "$work/x/$name"; mkdir -p "$work/x/$name"
  dpkg-deb -x "$deb" "$work/x/$name"
done

python3 "$here/build_corpus.py" "$work" "$repo"
