"""Minimal reader for R's serialization format (XDR) and lazy-load databases.

Enough to pull character vectors and data frames out of an installed R
package's data/Rdata.rdb + Rdata.rdx (used for the Jane Austen texts in
r-cran-janeaustenr).  Only the object types that plain data sets use are
handled; anything else raises.
"""
import gzip
import struct
import zlib

NILVALUE, GLOBALENV, UNBOUNDVALUE, MISSINGARG = 254, 253, 252, 251
BASENAMESPACE, NAMESPACESXP, PACKAGESXP, PERSISTSXP = 250, 249, 248, 247
EMPTYENV, BASEENV, ALTREP, REFSXP = 242, 241, 238, 255
SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP = 9, 10, 13, 14, 15, 16
DOTSXP, VECSXP, EXPRSXP, RAWSXP = 17, 19, 20, 24
ATTR_LIST, ATTR_LANG = 239, 240

NA_INT = -(2 ** 31)


class RObj:
    """An R value: kind (type code), value (python data), attrs (dict)."""

    def __init__(self, kind, value, attrs=None):
        self.kind = kind
        self.value = value
        self.attrs = attrs or {}

    def __repr__(self):
        return "RObj(%d, %r)" % (self.kind, type(self.value).__name__)


class _Reader:
    def __init__(self, data):
        self.d = data
        self.p = 0
        self.refs = []

    def int(self):
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        return n

    def raw(self, n):
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def header(self):
        fmt = self.raw(2)
        if fmt != b"X\n":
            raise ValueError("only XDR serialization is supported, got %r" % fmt)
        version = self.int()
        self.int()  # writer R version
        self.int()  # minimal reader version
        if version == 3:
            self.raw(self.int())  # native encoding name

    def pairlist_to_dict(self, obj):
        out = {}
        while obj is not None and obj.kind == LISTSXP:
            tag, car, cdr = obj.value
            out[tag if tag is not None else len(out)] = car
            obj = cdr
        return out

    def item(self):
        flags = self.int()
        kind = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        if kind == NILVALUE:
            return None
        if kind in (GLOBALENV, UNBOUNDVALUE, MISSINGARG, BASENAMESPACE, EMPTYENV, BASEENV):
            return RObj(kind, None)
        if kind == REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            return self.refs[idx - 1]
        if kind == PERSISTSXP:
            self.int()
            n = self.int()
            names = [self.item() for _ in range(n)]
            obj = RObj(kind, names)
            self.refs.append(obj)
            return obj
        if kind in (NAMESPACESXP, PACKAGESXP):
            self.int()
            n = self.int()
            obj = RObj(kind, [self.item() for _ in range(n)])
            self.refs.append(obj)
            return obj
        if kind == SYMSXP:
            name = self.item()
            obj = RObj(kind, name.value if name is not None else None)
            self.refs.append(obj)
            return obj
        if kind == ENVSXP:
            self.int()  # locked
            obj = RObj(kind, None)
            self.refs.append(obj)
            enclos = self.item()
            frame = self.item()
            hashtab = self.item()
            attrib = self.item()
            obj.value = (enclos, frame, hashtab)
            obj.attrs = self.pairlist_to_dict(attrib) if attrib is not None else {}
            return obj
        if kind in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTR_LIST, ATTR_LANG):
            attrs = self.item() if has_attr else None
            tag = self.item() if has_tag else None
            car = self.item()
            cdr = self.item()
            tagname = tag.value if isinstance(tag, RObj) else None
            obj = RObj(LISTSXP if kind in (LISTSXP, ATTR_LIST) else kind, (tagname, car, cdr))
            if attrs is not None:
                obj.attrs = self.pairlist_to_dict(attrs)
            return obj
        if kind == ALTREP:
            info = self.item()
            state = self.item()
            attr = self.item()
            obj = _expand_altrep(info, state)
            if attr is not None:
                obj.attrs = self.pairlist_to_dict(attr)
            return obj
        if kind == CHARSXP:
            n = self.int()
            if n == -1:
                return RObj(CHARSXP, None)
            raw = self.raw(n)
            return RObj(CHARSXP, raw.decode("utf-8", errors="replace"))
        if kind in (LGLSXP, INTSXP):
            n = self.length()
            vals = list(struct.unpack_from(">%di" % n, self.d, self.p))
            self.p += 4 * n
            obj = RObj(kind, vals)
        elif kind == REALSXP:
            n = self.length()
            vals = list(struct.unpack_from(">%dd" % n, self.d, self.p))
            self.p += 8 * n
            obj = RObj(kind, vals)
        elif kind == CPLXSXP:
            n = self.length()
            vals = list(struct.unpack_from(">%dd" % (2 * n), self.d, self.p))
            self.p += 16 * n
            obj = RObj(kind, vals)
        elif kind == STRSXP:
            n = self.length()
            obj = RObj(kind, [self.item().value for _ in range(n)])
        elif kind in (VECSXP, EXPRSXP):
            n = self.length()
            obj = RObj(kind, [self.item() for _ in range(n)])
        elif kind == RAWSXP:
            n = self.length()
            obj = RObj(kind, self.raw(n))
        else:
            raise ValueError("unsupported R object type %d" % kind)
        if has_attr:
            obj.attrs = self.pairlist_to_dict(self.item())
        return obj



def _expand_altrep(info, state):
    # info is a pairlist (class symbol, package symbol, type); only the
    # common compact sequences and wrappers are expanded.
    cls = info.value[1].value if info is not None else None
    if cls in ("compact_intseq", "compact_realseq"):
        n, start, step = state.value[:3]
        n = int(n)
        vals = [start + i * step for i in range(n)]
        if cls == "compact_intseq":
            return RObj(INTSXP, [int(v) for v in vals])
        return RObj(REALSXP, vals)
    if cls and cls.startswith("wrap_"):
        return state.value[0]
    if cls == "deferred_string":
        inner = state.value[1] if isinstance(state.value, tuple) else state
        return RObj(STRSXP, [str(v) for v in inner.value])
    raise ValueError("unsupported ALTREP class %r" % cls)


def unserialize(data):
    r = _Reader(data)
    r.header()
    return r.item()


def read_lazyload_db(prefix):
    """Return {name: RObj} for prefix.rdx / prefix.rdb."""
    with gzip.open(prefix + ".rdx", "rb") as f:
        index = unserialize(f.read())
    names = index.attrs["names"].value
    parts = dict(zip(names, index.value))
    var_names = parts["variables"].attrs["names"].value
    with open(prefix + ".rdb", "rb") as f:
        db = f.read()
    out = {}
    for name, loc in zip(var_names, parts["variables"].value):
        off, ln = (int(x) for x in loc.value)
        blob = db[off:off + ln]
        size = struct.unpack(">I", blob[:4])[0]
        body = blob[4:]
        if body[:1] != b"\x78":
            raise ValueError("only zlib-compressed lazy-load entries are handled")
        raw = zlib.decompress(body)
        assert len(raw) == size
        out[name] = unserialize(raw)
    return out


def dataframe_columns(obj):
    """{column name: list} for a data.frame / tibble RObj; factors -> labels."""
    cols = {}
    for name, col in zip(obj.attrs["names"].value, obj.value):
        vals = col.value
        levels = col.attrs.get("levels")
        if levels is not None:
            labels = levels.value
            vals = [labels[v - 1] if v != NA_INT else None for v in vals]
        cols[name] = vals
    return cols
