/* Hide AVX-512 from CPUID in this process, so that a program choosing its kernels at run time
 * (onnxruntime's MLAS, numpy, kiln) takes its AVX2 path on an AVX-512 machine. Used by
 * scripts/ort_compare.py --isa avx2: the kiln/ORT targets are defined on an AVX2-only
 * machine, and onnxruntime has no switch of its own to keep it off AVX-512.
 *
 * How: Linux's CPUID faulting (arch_prctl(ARCH_SET_CPUID, 0), /proc/cpuinfo flag `cpuid_fault`)
 * makes every CPUID in this thread, and in the threads it creates afterwards, raise SIGSEGV.
 * The handler runs the real CPUID with faulting briefly off, clears the AVX-512 bits of leaf 7,
 * and steps over the instruction. XGETBV is not touched: programs check the CPUID bit first.
 *
 * Loaded as LD_PRELOAD (a constructor installs it before main) or with dlopen/ctypes before the
 * program under test is loaded; kiln_cpuid_traps() says how many CPUIDs were answered, so the
 * caller can check that the mask was in force. Without `cpuid_fault` it prints one line and
 * exits 3: a comparison that silently ran on AVX-512 would be a wrong answer.
 *
 * Written by hand (50 lines) because no packaged tool does this: Intel SDE emulates a whole
 * CPU and is not on the package registries this project can reach.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static volatile long traps;

long kiln_cpuid_traps(void) { return traps; }

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    ucontext_t *uc = ctx;
    greg_t *r = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    /* CPUID faulting raises #GP, which the kernel reports as SI_KERNEL; anything else is a real
     * crash: restore the default action and let the instruction fault again. */
    if (si->si_code != SI_KERNEL || ip[0] != 0x0f || ip[1] != 0xa2) {
        signal(sig, SIG_DFL);
        return;
    }
    unsigned leaf = (unsigned)r[REG_RAX], sub = (unsigned)r[REG_RCX], a, b, c, d;
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    __cpuid_count(leaf, sub, a, b, c, d);
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
    if (leaf == 7 && sub == 0) {
        /* EBX: F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31.
         * ECX: VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14.
         * EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, FP16 23. */
        b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
        c &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
        d &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 23));
    } else if (leaf == 7 && sub == 1) {
        a &= ~(1u << 5); /* AVX512_BF16 */
    }
    r[REG_RAX] = a;
    r[REG_RBX] = b;
    r[REG_RCX] = c;
    r[REG_RDX] = d;
    r[REG_RIP] += 2;
    traps++;
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL) != 0 || syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        fprintf(stderr, "cpuid_no_avx512: this kernel/CPU has no CPUID faulting (cpuid_fault); cannot hide AVX-512\n");
        exit(3);
    }
}
