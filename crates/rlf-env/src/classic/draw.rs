//! The classic-control envs drawn as Gymnasium's `render_mode="rgb_array"` draws them (its pygame code: the same
//! sizes, shapes and colours), for videos. Shapes are filled by pixel centre, without anti-aliasing.
//!
//! Coordinates are Gymnasium's before its final vertical flip: `y` grows upwards from the bottom row.

use std::f64::consts::FRAC_PI_2;

use crate::Frame;

type Rgb = [u8; 3];

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [0, 0, 0];

/// A white picture to draw on.
struct Canvas {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Canvas {
    fn new(width: usize, height: usize) -> Self {
        Self {
            width,
            height,
            rgb: WHITE.repeat(width * height),
        }
    }

    fn put(&mut self, x: usize, y: usize, color: Rgb) {
        let row = self.height - 1 - y;
        let at = (row * self.width + x) * 3;
        self.rgb[at..at + 3].copy_from_slice(&color);
    }

    /// Every pixel whose centre `inside` accepts, within the box `(x0, y0)`–`(x1, y1)`.
    fn fill(
        &mut self,
        (x0, y0, x1, y1): (f64, f64, f64, f64),
        color: Rgb,
        inside: impl Fn(f64, f64) -> bool,
    ) {
        let clamp = |v: f64, n: usize| v.floor().clamp(0.0, n as f64) as usize;
        let (xs, xe) = (clamp(x0, self.width), clamp(x1 + 1.0, self.width));
        let (ys, ye) = (clamp(y0, self.height), clamp(y1 + 1.0, self.height));
        for y in ys..ye {
            for x in xs..xe {
                if inside(x as f64 + 0.5, y as f64 + 0.5) {
                    self.put(x, y, color);
                }
            }
        }
    }

    /// A filled polygon (its corners in order; even-odd rule).
    fn polygon(&mut self, corners: &[(f64, f64)], color: Rgb) {
        let bounds = corners.iter().fold(
            (f64::INFINITY, f64::INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY),
            |(a, b, c, d), &(x, y)| (a.min(x), b.min(y), c.max(x), d.max(y)),
        );
        self.fill(bounds, color, |px, py| {
            let mut inside = false;
            let mut j = corners.len() - 1;
            for (i, &(xi, yi)) in corners.iter().enumerate() {
                let (xj, yj) = corners[j];
                if (yi > py) != (yj > py) && px < (xj - xi) * (py - yi) / (yj - yi) + xi {
                    inside = !inside;
                }
                j = i;
            }
            inside
        });
    }

    /// A filled circle.
    fn circle(&mut self, (cx, cy): (f64, f64), r: f64, color: Rgb) {
        self.fill((cx - r, cy - r, cx + r, cy + r), color, |x, y| {
            (x - cx).powi(2) + (y - cy).powi(2) <= r * r
        });
    }

    /// A line `width` pixels wide.
    fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), width: f64, color: Rgb) {
        let (dx, dy) = (x1 - x0, y1 - y0);
        let len = dx.hypot(dy).max(1e-9);
        let (nx, ny) = (-dy / len * width / 2.0, dx / len * width / 2.0);
        self.polygon(
            &[
                (x0 + nx, y0 + ny),
                (x1 + nx, y1 + ny),
                (x1 - nx, y1 - ny),
                (x0 - nx, y0 - ny),
            ],
            color,
        );
    }

    fn frame(self) -> Frame {
        Frame {
            width: self.width,
            height: self.height,
            rgb: self.rgb,
        }
    }
}

/// `(x, y)` turned by `angle` radians anticlockwise (pygame's `Vector2.rotate_rad`), then moved by `(dx, dy)`.
fn turned(corners: &[(f64, f64)], angle: f64, (dx, dy): (f64, f64)) -> Vec<(f64, f64)> {
    let (s, c) = angle.sin_cos();
    corners
        .iter()
        .map(|&(x, y)| (x * c - y * s + dx, x * s + y * c + dy))
        .collect()
}

/// The corners of the box `l`–`r` by `b`–`t` (pygame's order).
fn rect(l: f64, r: f64, t: f64, b: f64) -> [(f64, f64); 4] {
    [(l, b), (l, t), (r, t), (r, b)]
}

/// CartPole-v1 (600 × 400): the cart, the pole, its axle and the track, from `[x, x_dot, theta, theta_dot]`.
pub(crate) fn cartpole(state: &[f64; 4], x_threshold: f64, half_pole_length: f64) -> Frame {
    let w = 600.0;
    let mut c = Canvas::new(600, 400);
    let scale = w / (2.0 * x_threshold);
    let (pole_width, pole_len) = (10.0, scale * 2.0 * half_pole_length);
    let (cart_width, cart_height) = (50.0, 30.0);
    let axle_offset = cart_height / 4.0;
    let cart_x = state[0] * scale + w / 2.0;
    let cart_y = 100.0;
    let cart = rect(
        -cart_width / 2.0,
        cart_width / 2.0,
        cart_height / 2.0,
        -cart_height / 2.0,
    );
    c.polygon(&turned(&cart, 0.0, (cart_x, cart_y)), BLACK);
    let pole = rect(
        -pole_width / 2.0,
        pole_width / 2.0,
        pole_len - pole_width / 2.0,
        -pole_width / 2.0,
    );
    c.polygon(
        &turned(&pole, -state[2], (cart_x, cart_y + axle_offset)),
        [202, 152, 101],
    );
    c.circle((cart_x, cart_y + axle_offset), pole_width / 2.0, [129, 132, 203]);
    c.line((0.0, cart_y), (w, cart_y), 1.0, BLACK);
    c.frame()
}

/// Acrobot-v1 (500 × 500): the two links and their joints, from `[theta1, theta2, ...]`.
pub(crate) fn acrobot(state: &[f64; 4], link_1: f64, link_2: f64) -> Frame {
    let mut c = Canvas::new(500, 500);
    let bound = link_1 + link_2 + 0.2;
    let scale = 500.0 / (2.0 * bound);
    let offset = 250.0;
    let p1 = (-link_1 * state[0].cos() * scale, link_1 * state[0].sin() * scale);
    let p2 = (
        p1.0 - link_2 * (state[0] + state[1]).cos() * scale,
        p1.1 + link_2 * (state[0] + state[1]).sin() * scale,
    );
    c.line(
        (-2.2 * scale + offset, scale + offset),
        (2.2 * scale + offset, scale + offset),
        1.0,
        BLACK,
    );
    // Gymnasium swaps each point's coordinates (`[:, ::-1]`).
    let joints = [(0.0, 0.0), (p1.1, p1.0), (p2.1, p2.0)];
    let angles = [state[0] - FRAC_PI_2, state[0] + state[1] - FRAC_PI_2];
    for ((x, y), (angle, length)) in joints.iter().zip(angles.iter().zip([link_1, link_2])) {
        let at = (x + offset, y + offset);
        let link = rect(0.0, length * scale, 0.1 * scale, -0.1 * scale);
        c.polygon(&turned(&link, *angle, at), [0, 204, 204]);
        c.circle(at, 0.1 * scale, [204, 204, 0]);
    }
    c.frame()
}

/// Pendulum-v1 (500 × 500): the rod, its ends and the axle, from `[theta, theta_dot]`.
pub(crate) fn pendulum(state: &[f64; 2]) -> Frame {
    let mut c = Canvas::new(500, 500);
    let scale = 500.0 / 4.4;
    let offset = (250.0, 250.0);
    let (rod_length, rod_width) = (scale, 0.2 * scale);
    let rod = rect(0.0, rod_length, rod_width / 2.0, -rod_width / 2.0);
    let angle = state[0] + FRAC_PI_2;
    c.polygon(&turned(&rod, angle, offset), [204, 77, 77]);
    c.circle(offset, rod_width / 2.0, [204, 77, 77]);
    let end = turned(&[(rod_length, 0.0)], angle, offset)[0];
    c.circle(end, rod_width / 2.0, [204, 77, 77]);
    c.circle(offset, 0.05 * scale, BLACK);
    c.frame()
}

/// MountainCar-v0 and MountainCarContinuous-v0 (600 × 400): the hill, the car and its wheels, the flag at
/// `goal`, from the car's position.
pub(crate) fn mountain_car(position: f64, min_position: f64, max_position: f64, goal: f64) -> Frame {
    let mut c = Canvas::new(600, 400);
    let scale = 600.0 / (max_position - min_position);
    let height = |x: f64| (3.0 * x).sin() * 0.45 + 0.55;
    let (car_width, car_height, clearance) = (40.0, 20.0, 10.0);
    let hill: Vec<(f64, f64)> = (0..100)
        .map(|i| {
            let x = min_position + (max_position - min_position) * i as f64 / 99.0;
            ((x - min_position) * scale, height(x) * scale)
        })
        .collect();
    for pair in hill.windows(2) {
        c.line(pair[0], pair[1], 1.5, BLACK);
    }
    let at = (
        (position - min_position) * scale,
        clearance + height(position) * scale,
    );
    let tilt = (3.0 * position).cos();
    let car = rect(-car_width / 2.0, car_width / 2.0, car_height, 0.0);
    c.polygon(&turned(&car, tilt, at), BLACK);
    for wheel in turned(&[(car_width / 4.0, 0.0), (-car_width / 4.0, 0.0)], tilt, at) {
        c.circle(wheel, car_height / 2.5, [128, 128, 128]);
    }
    let flag_x = (goal - min_position) * scale;
    let (flag_y1, flag_y2) = (height(goal) * scale, height(goal) * scale + 50.0);
    c.line((flag_x, flag_y1), (flag_x, flag_y2), 1.0, BLACK);
    c.polygon(
        &[
            (flag_x, flag_y2),
            (flag_x, flag_y2 - 10.0),
            (flag_x + 25.0, flag_y2 - 5.0),
        ],
        [204, 204, 0],
    );
    c.frame()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixel(f: &Frame, x: usize, row: usize) -> [u8; 3] {
        let at = (row * f.width + x) * 3;
        [f.rgb[at], f.rgb[at + 1], f.rgb[at + 2]]
    }

    #[test]
    fn cartpole_draws_the_cart_where_it_is_and_the_pole_as_it_leans() {
        let upright = cartpole(&[0.0; 4], 2.4, 0.5);
        assert_eq!(
            (upright.width, upright.height, upright.rgb.len()),
            (600, 400, 600 * 400 * 3)
        );
        // The cart's centre (x = 300, y = 100 from the bottom) is black; the pole above it is brown.
        assert_eq!(pixel(&upright, 300, 399 - 100), BLACK);
        assert_eq!(pixel(&upright, 300, 399 - 200), [202, 152, 101]);
        assert_eq!(pixel(&upright, 10, 10), WHITE);
        // Moved right by 1 (125 pixels) and leaning right: the pole's top is right of the cart.
        let moved = cartpole(&[1.0, 0.0, 0.3, 0.0], 2.4, 0.5);
        assert_eq!(pixel(&moved, 425, 399 - 100), BLACK);
        assert_eq!(pixel(&moved, 300, 399 - 100), WHITE);
        assert_eq!(pixel(&moved, 425 + 30, 399 - 200), [202, 152, 101]);
    }

    #[test]
    fn every_env_draws_something_on_white() {
        let frames = [
            acrobot(&[0.3, -0.2, 0.0, 0.0], 1.0, 1.0),
            pendulum(&[1.0, 0.0]),
            mountain_car(-0.5, -1.2, 0.6, 0.5),
        ];
        for f in frames {
            let drawn = f.rgb.chunks(3).filter(|p| *p != WHITE).count();
            assert!(
                drawn > 500 && drawn < f.width * f.height / 2,
                "{drawn} pixels drawn"
            );
        }
    }
}
