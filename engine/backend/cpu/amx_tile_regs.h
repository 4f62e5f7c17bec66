// The tile registers' configuration, loads and stores, for the matrix-unit files (kernels_amx.cc's
// BF16 Gemm, kernels_avx512vnni.cc's AMX-INT8 Gemms), each of which adds its own products. GCC's
// tile intrinsics paste the tile number into the instruction text, so each needs a literal: hence
// the if-constexpr chains. No include guard and no includes, like amx_gemm_impl.h: each file
// includes it inside its own anonymous namespace (both are built with -mamx-tile), so the copies
// never meet at link time.
template <const AmxTileConfig& kConfig>
struct AmxTileRegs {
  static void Configure() { _tile_loadconfig(&kConfig); }
  static void Release() { _tile_release(); }
  // _tile_loadd's asm does not tell the compiler that it reads memory, so a compiler barrier
  // keeps the stores that fill a tile's bytes (packing) before it.
  template <int kT>
  static void Load(const void* base, int64_t stride) {
    static_assert(kT >= 0 && kT < 8, "tiles 0-7");
    __asm__ volatile("" ::: "memory");
    if constexpr (kT == 0) _tile_loadd(0, base, stride);
    if constexpr (kT == 1) _tile_loadd(1, base, stride);
    if constexpr (kT == 2) _tile_loadd(2, base, stride);
    if constexpr (kT == 3) _tile_loadd(3, base, stride);
    if constexpr (kT == 4) _tile_loadd(4, base, stride);
    if constexpr (kT == 5) _tile_loadd(5, base, stride);
    if constexpr (kT == 6) _tile_loadd(6, base, stride);
    if constexpr (kT == 7) _tile_loadd(7, base, stride);
  }
  // Both Gemms keep their C tiles in tiles 0-3, the only ones they store or clear.
  template <int kT>
  static void Zero() {
    static_assert(kT >= 0 && kT < 4, "C tiles 0-3");
    if constexpr (kT == 0) _tile_zero(0);
    if constexpr (kT == 1) _tile_zero(1);
    if constexpr (kT == 2) _tile_zero(2);
    if constexpr (kT == 3) _tile_zero(3);
  }
  template <int kT>
  static void Store(void* base, int64_t stride) {
    static_assert(kT >= 0 && kT < 4, "C tiles 0-3");
    if constexpr (kT == 0) _tile_stored(0, base, stride);
    if constexpr (kT == 1) _tile_stored(1, base, stride);
    if constexpr (kT == 2) _tile_stored(2, base, stride);
    if constexpr (kT == 3) _tile_stored(3, base, stride);
  }
};
