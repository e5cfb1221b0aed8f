//! Resizing an image observation, or the image part of a Dict observation, by area interpolation.

use crate::{Action, BoxSpace, Env, EnvError, Frame, Space, Step};

/// For each output cell of a resize from `n` to `m` values along one axis, the input cells it covers and their
/// weights (the fraction of the output cell each covers): area interpolation, as OpenCV's `INTER_AREA`.
fn area_weights(n: usize, m: usize) -> Vec<Vec<(usize, f32)>> {
    let scale = n as f64 / m as f64;
    (0..m)
        .map(|i| {
            let (from, to) = (i as f64 * scale, (i + 1) as f64 * scale);
            (from.floor() as usize..(to.ceil() as usize).min(n))
                .map(|j| {
                    let overlap = (to.min(j as f64 + 1.0) - from.max(j as f64)).max(0.0);
                    (j, (overlap / scale) as f32)
                })
                .filter(|&(_, w)| w > 0.0)
                .collect()
        })
        .collect()
}

/// Resizes an image (a `Box` of shape `(H, W)` or `(H, W, C)`: the observation itself, or the Dict part named `key`)
/// to `height` × `width` by area interpolation, as OpenCV's `INTER_AREA` (rounded to whole numbers for a box of
/// bytes). Sample Factory renders VizDoom small for the same reason: a learner on 240×320 frames is many times
/// slower than on 72×128 ones. The image's bounds become the smallest and largest of its old ones.
#[derive(Debug, Clone)]
pub struct ResizeImage<E> {
    inner: E,
    /// Where the image starts in the inner observation and how many values it has.
    at: usize,
    len: usize,
    /// Input rows and columns, channels.
    from: [usize; 2],
    channels: usize,
    bytes: bool,
    weights: [Vec<Vec<(usize, f32)>>; 2],
    inner_obs: Vec<f32>,
    rows: Vec<f32>,
    observation_space: Space,
}

impl<E: Env> ResizeImage<E> {
    /// Wraps `inner`, whose observation (`key` `None`) or Dict part `key` is an image.
    pub fn new(inner: E, key: Option<&str>, height: usize, width: usize) -> Result<Self, EnvError> {
        let unsupported = |what: String| EnvError::Unsupported {
            env: inner.id().to_owned(),
            what,
        };
        let space = inner.observation_space();
        let (at, image) = match (key, space) {
            (None, Space::Box(b)) => (0, b),
            (Some(key), Space::Dict(parts)) => {
                let i = parts.iter().position(|(k, _)| k == key).ok_or_else(|| {
                    unsupported(format!("ResizeImage of part '{key}' of {space}: no such part"))
                })?;
                let at = parts[..i].iter().map(|(_, s)| s.flat_dim()).sum();
                match &parts[i].1 {
                    Space::Box(b) => (at, b),
                    other => return Err(unsupported(format!("ResizeImage of part '{key}', {other}"))),
                }
            }
            _ => return Err(unsupported(format!("ResizeImage of {space}"))),
        };
        let (from, channels) = match *image.shape() {
            [h, w] => ([h, w], 1),
            [h, w, c] => ([h, w], c),
            _ => {
                return Err(unsupported(format!(
                    "ResizeImage of {image} (it takes (H, W) or (H, W, C) images)"
                )))
            }
        };
        if height == 0 || width == 0 {
            return Err(EnvError::InvalidSpace(format!("ResizeImage to {height}x{width}")));
        }
        let mut shape = vec![height, width];
        if image.shape().len() == 3 {
            shape.push(channels);
        }
        let low = image.low().iter().copied().fold(f32::INFINITY, f32::min);
        let high = image.high().iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let resized = BoxSpace::uniform(low, high, shape)?;
        let resized = Space::Box(if image.bytes() {
            resized.into_bytes()?
        } else {
            resized
        });
        let observation_space = match (key, space) {
            (Some(key), Space::Dict(parts)) => Space::Dict(
                parts
                    .iter()
                    .map(|(k, s)| (k.clone(), if k == key { resized.clone() } else { s.clone() }))
                    .collect(),
            ),
            _ => resized,
        };
        Ok(Self {
            at,
            len: image.size(),
            from,
            channels,
            bytes: image.bytes(),
            weights: [area_weights(from[0], height), area_weights(from[1], width)],
            inner_obs: vec![0.0; space.flat_dim()],
            rows: vec![0.0; height * from[1] * channels],
            observation_space,
            inner,
        })
    }

    /// Writes the inner observation, its image resized, into `obs`.
    fn resize(&mut self, obs: &mut [f32]) {
        let (at, c) = (self.at, self.channels);
        let row_len = self.from[1] * c;
        let out_len = self.weights[0].len() * self.weights[1].len() * c;
        obs[..at].copy_from_slice(&self.inner_obs[..at]);
        obs[at + out_len..].copy_from_slice(&self.inner_obs[at + self.len..]);
        let image = &self.inner_obs[at..at + self.len];
        // Rows first: each output row is a weighted sum of input rows (every column and channel alike).
        for (y, row) in self.weights[0].iter().zip(self.rows.chunks_exact_mut(row_len)) {
            row.fill(0.0);
            for &(j, weight) in y {
                for (r, v) in row.iter_mut().zip(&image[j * row_len..(j + 1) * row_len]) {
                    *r += weight * v;
                }
            }
        }
        let out_row = self.weights[1].len() * c;
        for (out, row) in obs[at..at + out_len]
            .chunks_exact_mut(out_row)
            .zip(self.rows.chunks_exact(row_len))
        {
            for (x, pixel) in self.weights[1].iter().zip(out.chunks_exact_mut(c)) {
                for (ch, o) in pixel.iter_mut().enumerate() {
                    let v: f32 = x.iter().map(|&(k, weight)| weight * row[k * c + ch]).sum();
                    *o = if self.bytes { v.round() } else { v };
                }
            }
        }
    }
}

impl<E: Env> Env for ResizeImage<E> {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn render(&mut self) -> Result<Option<Frame>, EnvError> {
        self.inner.render()
    }
    fn observation_space(&self) -> &Space {
        &self.observation_space
    }
    fn action_space(&self) -> &Space {
        self.inner.action_space()
    }
    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
        self.inner.reset(seed, &mut self.inner_obs)?;
        self.resize(obs);
        Ok(())
    }
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
        let step = self.inner.step(action, &mut self.inner_obs)?;
        self.resize(obs);
        Ok(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Dict of a 2-value vector and a 4×6 RGB image of bytes, pixel (y, x) channel c = 10·y + x + 100·c, and
    /// the vector `[t, -t]` at step `t`.
    struct Picture {
        t: u32,
        space: Space,
        actions: Space,
    }

    impl Picture {
        fn new() -> Self {
            let image = BoxSpace::uniform(0.0, 255.0, vec![4, 6, 3])
                .unwrap()
                .into_bytes()
                .unwrap();
            let space = Space::Dict(vec![
                (
                    "vector".to_owned(),
                    Space::Box(BoxSpace::uniform(-9.0, 9.0, vec![2]).unwrap()),
                ),
                ("screen".to_owned(), Space::Box(image)),
            ]);
            Self {
                t: 0,
                space,
                actions: Space::discrete(2),
            }
        }
        fn draw(&self, obs: &mut [f32]) {
            obs[0] = self.t as f32;
            obs[1] = -(self.t as f32);
            for y in 0..4 {
                for x in 0..6 {
                    for c in 0..3 {
                        obs[2 + (y * 6 + x) * 3 + c] = (10 * y + x + 100 * c) as f32;
                    }
                }
            }
        }
    }

    impl Env for Picture {
        fn id(&self) -> &str {
            "Picture"
        }
        fn observation_space(&self) -> &Space {
            &self.space
        }
        fn action_space(&self) -> &Space {
            &self.actions
        }
        fn reset(&mut self, _seed: Option<u64>, obs: &mut [f32]) -> Result<(), EnvError> {
            self.t = 0;
            self.draw(obs);
            Ok(())
        }
        fn step(&mut self, _action: Action<'_>, obs: &mut [f32]) -> Result<Step, EnvError> {
            self.t += 1;
            self.draw(obs);
            Ok(Step::default())
        }
    }

    #[test]
    fn area_weights_cover_each_output_cell_once() {
        for (n, m) in [(210, 84), (160, 84), (84, 84), (6, 4), (4, 6)] {
            let w = area_weights(n, m);
            assert_eq!(w.len(), m);
            for cell in &w {
                let total: f32 = cell.iter().map(|&(_, v)| v).sum();
                assert!((total - 1.0).abs() < 1e-5, "{n}->{m}: {cell:?}");
            }
            // Every input cell is used, with the same total weight (n / m of an output cell... scaled).
            let mut used = vec![0.0_f32; n];
            w.iter().flatten().for_each(|&(j, v)| used[j] += v);
            assert!(
                used.iter().all(|&u| (u - m as f32 / n as f32).abs() < 1e-4),
                "{n}->{m}"
            );
        }
        // 210 -> 84: output row 0 covers input rows 0, 1 and half of 2.
        assert_eq!(area_weights(210, 84)[0], [(0, 0.4), (1, 0.4), (2, 0.2)]);
    }

    #[test]
    fn the_image_part_of_a_dict_is_resized_by_areas_and_the_rest_kept() {
        let mut env = ResizeImage::new(Picture::new(), Some("screen"), 2, 3).unwrap();
        assert_eq!(
            env.observation_space().to_string(),
            "Dict('vector': Box(-9.0, 9.0, (2,), float32), 'screen': Box(0.0, 255.0, (2, 3, 3), uint8))"
        );
        let mut obs = vec![0.0; 2 + 2 * 3 * 3];
        env.step(Action::Discrete(0), &mut obs).unwrap();
        assert_eq!(obs[..2], [1.0, -1.0]);
        // Output (0, 0) averages rows 0-1 and columns 0-1: 10·0.5 + 0.5 = 5.5, rounded to 6 (channel 0).
        let pixel = |y: usize, x: usize| &obs[2 + (y * 3 + x) * 3..2 + (y * 3 + x) * 3 + 3];
        assert_eq!(pixel(0, 0), [6.0, 106.0, 206.0]);
        assert_eq!(pixel(1, 2), [(25.0f32 + 4.5).round(), 130.0, 230.0]);
        assert!(env.observation_space().contains(&crate::Value::Dict(vec![
            ("vector".to_owned(), crate::Value::Box(obs[..2].to_vec())),
            ("screen".to_owned(), crate::Value::Box(obs[2..].to_vec())),
        ])));
        assert!(ResizeImage::new(Picture::new(), Some("vector"), 2, 3).is_err());
        assert!(ResizeImage::new(Picture::new(), Some("nothing"), 2, 3).is_err());
        assert!(ResizeImage::new(Picture::new(), None, 2, 3).is_err());
    }
}
