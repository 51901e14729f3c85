/*
 * knn_gpu_policy.cuh: the limits of the GPU search's kernels, and the one
 * table of thresholds from which knn_gpu_policy.cu makes every automatic
 * choice of the search. Each threshold names the script in inst/bench
 * that measures it; inst/bench/RESULTS.md holds the current numbers.
 * Changing one changes the time of a search, never its bits.
 */
#ifndef KNN_GPU_POLICY_CUH
#define KNN_GPU_POLICY_CUH

/* ---- what the kernels can do (limits, not choices) --------------------- */

/* The fused kernel (knn_gpu_fused.cu): rows per block and nodes per
 * column block (a pruned walk's boxes hold as many); the largest k (past
 * it the rows' k smallest, a heap in device memory past k = 32, and the
 * shared walk's merge would need more); the products take fp16 inputs
 * below this many features (knn_mma says why). */
#define KNN_FUSED_ROWS 128
#define KNN_FUSED_COLS 128
#define KNN_FUSED_MAX_K 128
#define KNN_FUSED_HALF_MAX_FEATURES (1 << 26)
/* The warp selection kernel's largest queue (knn_gpu_select.cu). */
#define KNN_WARP_MAX_K 32
/* The shared walk's merge: four entries a lane of a warp
 * (knn_gpu_pairs.cu). */
#define KNN_PAIRS_MAX_K 128

/* ---- the thresholds of the automatic choices ----------------------------
 *
 * Selection after a panel of products (knn_select_choose), measured by
 * inst/bench/select_thresholds.R: the warp kernel wins only for small k
 * and row tiles big enough to keep every SM's warps busy; the radix
 * kernel everywhere else. */
#define KNN_WARP_AUTO_MAX_K 16
#define KNN_WARP_MIN_ROWS 16384
/* The fused path against the panel path (knn_fused_choose), measured by
 * inst/bench/fused_crossover.R: the plain fused walk wins up to this k
 * and this many features, given a block of rows per this many SMs (its
 * query cases: with fewer blocks the panel's GEMM keeps the device
 * busier). */
#define KNN_FUSED_AUTO_MAX_K 32
#define KNN_FUSED_AUTO_MAX_FEATURES 160
#define KNN_FUSED_SMS_PER_BLOCK 4
/* The shared walk (knn_pairs_choose), measured by inst/bench/pairs.R: it
 * wins at every k up to this one, and past it from this many nodes. */
#define KNN_PAIRS_AUTO_SMALL_K 32
#define KNN_PAIRS_AUTO_MIN_NODES 262144
/* Refining TF32 candidates against climbing to split TF32
 * (knn_dev_next_step), measured by inst/bench/rungs.R on log-counts:
 * refining costs more than the split's products past one TF32 candidate
 * a row per this many reference nodes. */
#define KNN_REFINE_NODES_PER_CANDIDATE 200.0
/* A row rescores its TF32 candidates in float32 only past this many
 * (knn_gpu_select.cu): below it the re-rank of the few extra ones costs
 * less than the rescoring. Not measured on its own: inst/bench/rungs.R
 * times the refinement as a whole. */
#define KNN_REFINE_MIN(k) (2 * (k) + 32)
/* Local frames tried from TF32 keep the fused path while their first tile
 * leaves at most 3k + 16 candidates a row, or one a row per this many
 * reference nodes where that is more (knn_local_too_wide): tight
 * replicates leave about 2.6k, cell types on PCs 9k and more, where split
 * TF32 leaves 1.3k (inst/bench/shapes.R). The re-rank of a local tile's
 * extra candidates costs per candidate, split TF32's products per
 * reference node; cell types on PCs (300,000 and 1,000,000 nodes) take as
 * long either way at about one candidate a row per 1700 nodes, and the
 * allowance, one per 2048, leans to split TF32 where the two are close
 * (RESULTS.md, "Local frames, cheaper"). */
#define KNN_LOCAL_PER_K 3
#define KNN_LOCAL_EXTRA 16
#define KNN_LOCAL_NODES_PER_CANDIDATE 2048.0
/* After a local fused tile ran again for its slots, the tiles after it
 * get uniform slots for the most any of its rows needed, this much again
 * (local tiles of one search are alike: genes at many levels at 1,000,000
 * ran every local tile twice), in at most this share of the memory free
 * beyond the reserve (knn_grow_uniform). Not measured on their own: the
 * A/B run of RESULTS.md times the growth as a whole. */
#define KNN_GROW_SLOTS 1.5
#define KNN_GROW_MEMORY_SHARE 0.25
/* Rows of a tile that overflow their slots go apart (knn_rows_go_apart)
 * where they are at most this share of its rows, and a shared walk's lost
 * nodes where they are at most this share of the nodes
 * (knn_walk_too_lossy): a row apart costs a panel row of float32 products
 * and its selection, a few of a fused tile's rows, where the tile run
 * again costs all of its rows once more (heavy tails at 1,000,000 nodes
 * ran nearly every tile twice; inst/bench/shapes_ab.R, RESULTS.md "Rows
 * apart"). */
#define KNN_APART_SHARE 16
/* More rows go apart where their float32 products cost less than their
 * tile's run took: seconds per multiply-add of a row apart, its share of
 * the selection included (a trace of 1053 rows apart against 1,000,000
 * nodes of 100 features took 8.6e-14; inst/bench/gemm_rates.py's float32
 * GEMM alone runs at 5.6e-14), rounded up so that a tile runs again
 * where the two are close. */
#define KNN_APART_SECONDS_PER_PRODUCT 1e-13

/* A tile is crowded (refine or climb) past knn_rung_too_wide's 4k + 64
 * candidates a row (src/engine/knn.h, shared with the CPU), measured by
 * inst/bench/rungs.R and inst/bench/shapes.R. */

#endif
