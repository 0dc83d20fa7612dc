//! SplitMix64, and the fixed hash a hashed key uses.

/// SplitMix64 (Steele, Lea and Flood): a tiny seeded generator, so the
/// simulator needs no dependency and replays exactly.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// A number in `0..n` (Lemire's multiply-shift; `n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A random version 4 UUID as a `u128` (122 random bits). The version
    /// and variant bits also keep it away from 0 and `u128::MAX`, which the
    /// model uses as MinKey and MaxKey.
    pub fn uuid_v4(&mut self) -> u128 {
        let v = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
        let v = (v & !(0xF << 76)) | (0x4 << 76);
        (v & !(0x3 << 62)) | (0x2 << 62)
    }
}

/// SplitMix64's finalizer: a bijective 64-bit mix.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The fixed 64-bit hash of a hashed key (of a field's encoded value).
/// MongoDB hashes with MD5; what matters here is that equal values hash
/// alike and neighbours scatter.
pub fn hash64(value: u128) -> u64 {
    mix64((value as u64) ^ mix64((value >> 64) as u64 ^ 0x5EED_0002))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_from_its_seed() {
        let (mut a, mut b) = (SplitMix64::new(2), SplitMix64::new(2));
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(SplitMix64::new(3).next_u64(), xs[0]);
        let mut r = SplitMix64::new(7);
        assert!((0..10_000).all(|_| r.below(3) < 3));
    }

    #[test]
    fn uuids_are_version_4() {
        let mut r = SplitMix64::new(2);
        for _ in 0..1_000 {
            let id = r.uuid_v4();
            assert_eq!((id >> 76) & 0xF, 4);
            assert_eq!((id >> 62) & 0x3, 2);
            assert!(id != 0 && id != u128::MAX);
        }
    }
}
