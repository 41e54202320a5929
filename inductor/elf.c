/* inductor/elf.c: a strict reader for the object files in the kernel cache, checked before LLVM
 * sees them.
 *
 * An entry on disk passes its checksum and may still hold a damaged object: a broken writer
 * hashes what it wrote, and anyone who can write the cache directory can forge the header. LLVM's
 * object reader is not made for such input: its C API ends the process (report_fatal_error,
 * "LLVM ERROR: st_name ... is past the end of the string table") on a symbol whose name lies
 * outside the string table; fuzz/fuzz_kcache found it (issue 17). So the checks are done here, in
 * C, on the bytes: the ELF header, every section inside the file, the symbol table with its names
 * inside a terminated string table and its symbols inside their sections, every relocation's
 * symbol and place in range; and then that every kernel of the module is defined by name, a
 * function with a size. What passes is what LLVM wrote for this host: a little-endian ELF64
 * relocatable object for this machine. Fields are copied out with memcpy, as the buffer may be
 * unaligned. */
#include "internal.h"

#include <elf.h>

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#else
#define HOST_MACHINE EM_NONE /* no host object is accepted: every entry is compiled again */
#endif

/* Whether [off, off + len) lies in [0, size), without overflow. */
static bool inside(uint64_t off, uint64_t len, size_t size) { return off <= size && len <= size - off; }

/* Section i's header, copied out of the table the ELF header was checked to point at. */
static Elf64_Shdr section(const char *obj, const Elf64_Ehdr *eh, unsigned i) {
  Elf64_Shdr s;
  memcpy(&s, obj + eh->e_shoff + (uint64_t)i * sizeof s, sizeof s);
  return s;
}

/* Whether string table s (a section inside the file) is non-empty and ends with its NUL, so any
 * offset below its size starts a terminated string. */
static bool strtab_ok(const char *obj, const Elf64_Shdr *s) {
  return s->sh_type == SHT_STRTAB && s->sh_size > 0 && obj[s->sh_offset + s->sh_size - 1] == 0;
}

bool ind_elf_defines(const void *bytes, size_t size, int n, const char *const *names) {
  const char *obj = bytes;
  Elf64_Ehdr eh;
  if (size < sizeof eh || HOST_MACHINE == EM_NONE) return false;
  memcpy(&eh, obj, sizeof eh);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  const int host_data = ELFDATA2MSB;
#else
  const int host_data = ELFDATA2LSB;
#endif
  if (memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != host_data ||
      eh.e_type != ET_REL || eh.e_machine != HOST_MACHINE || eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 ||
      eh.e_shstrndx >= eh.e_shnum || !inside(eh.e_shoff, (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr), size))
    return false;
  /* every section inside the file, its link in range; its name inside the section-name table */
  unsigned symtab = 0;
  for (unsigned i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr s = section(obj, &eh, i);
    if ((s.sh_type != SHT_NOBITS && !inside(s.sh_offset, s.sh_size, size)) || s.sh_link >= eh.e_shnum) return false;
    if (s.sh_type == SHT_SYMTAB) {
      if (symtab) return false; /* LLVM writes one */
      symtab = i;
    }
  }
  Elf64_Shdr shstr = section(obj, &eh, eh.e_shstrndx);
  if (!strtab_ok(obj, &shstr)) return false;
  for (unsigned i = 0; i < eh.e_shnum; i++)
    if (section(obj, &eh, i).sh_name >= shstr.sh_size) return false;
  if (!symtab) return false;
  /* the symbols: names in the terminated string table, defined ones inside their sections */
  Elf64_Shdr st = section(obj, &eh, symtab), str = section(obj, &eh, st.sh_link);
  if (st.sh_entsize != sizeof(Elf64_Sym) || st.sh_size % sizeof(Elf64_Sym) || !strtab_ok(obj, &str)) return false;
  uint64_t n_syms = st.sh_size / sizeof(Elf64_Sym);
  int n_found = 0;
  bool *found = calloc((size_t)n + 1, 1);
  if (!found) return false;
  bool ok = true;
  for (uint64_t j = 0; ok && j < n_syms; j++) {
    Elf64_Sym sym;
    memcpy(&sym, obj + st.sh_offset + j * sizeof sym, sizeof sym);
    bool defined = sym.st_shndx != SHN_UNDEF && sym.st_shndx < SHN_LORESERVE;
    ok = sym.st_name < str.sh_size && sym.st_shndx != SHN_XINDEX && (sym.st_shndx < eh.e_shnum || sym.st_shndx >= SHN_LORESERVE);
    if (ok && defined) {
      Elf64_Shdr in = section(obj, &eh, sym.st_shndx);
      ok = inside(sym.st_value, sym.st_size, in.sh_size);
    }
    if (!ok || !defined || ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_size == 0) continue;
    const char *name = obj + str.sh_offset + sym.st_name;
    for (int k = 0; k < n; k++)
      if (!found[k] && !strcmp(name, names[k])) found[k] = true, n_found++;
  }
  free(found);
  /* the relocations: against this symbol table, a symbol in it, a place inside their section */
  for (unsigned i = 0; ok && i < eh.e_shnum; i++) {
    Elf64_Shdr r = section(obj, &eh, i);
    if (r.sh_type != SHT_RELA && r.sh_type != SHT_REL) continue;
    size_t esize = r.sh_type == SHT_RELA ? sizeof(Elf64_Rela) : sizeof(Elf64_Rel);
    if (r.sh_entsize != esize || r.sh_size % esize || r.sh_link != symtab || r.sh_info == 0 || r.sh_info >= eh.e_shnum)
      return false;
    Elf64_Shdr target = section(obj, &eh, r.sh_info);
    for (uint64_t off = 0; ok && off < r.sh_size; off += esize) {
      Elf64_Rel rel; /* a Rela begins with a Rel */
      memcpy(&rel, obj + r.sh_offset + off, sizeof rel);
      ok = ELF64_R_SYM(rel.r_info) < n_syms && rel.r_offset < target.sh_size;
    }
  }
  return ok && n_found == n;
}
