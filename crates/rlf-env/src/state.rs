//! The bytes of an env's state for an exact resume ([`Env::save_state`](crate::Env::save_state)): each layer (a
//! wrapper, then the env it wraps) appends its own values, encoded with postcard, and
//! [`load_state`](crate::Env::load_state) reads them back in the same order from the front of the input.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::EnvError;

/// Appends `value` to `out`.
pub fn put<T: Serialize + ?Sized>(env: &str, out: &mut Vec<u8>, value: &T) -> Result<(), EnvError> {
    *out = postcard::to_extend(value, std::mem::take(out)).map_err(|e| EnvError::InvalidState {
        env: env.to_owned(),
        reason: format!("its state does not encode: {e}"),
    })?;
    Ok(())
}

/// Reads a value of type `T` from the front of `input` and moves `input` past it.
pub fn take<T: DeserializeOwned>(env: &str, input: &mut &[u8]) -> Result<T, EnvError> {
    let (value, rest) = postcard::take_from_bytes(input).map_err(|e| EnvError::InvalidState {
        env: env.to_owned(),
        reason: format!("the saved state does not decode ({e}): it was saved by another env or version"),
    })?;
    *input = rest;
    Ok(value)
}

/// The error of an env that cannot save or load its state.
pub(crate) fn unsupported(env: &str, what: &str) -> EnvError {
    EnvError::Unsupported {
        env: env.to_owned(),
        what: format!("{what} (an exact resume of its state)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_in_order_and_leave_the_rest() {
        let mut out = Vec::new();
        put("E", &mut out, &(1.5f64, 7u64)).unwrap();
        put("E", &mut out, &[true, false]).unwrap();
        out.push(9);
        let mut input = &out[..];
        assert_eq!(take::<(f64, u64)>("E", &mut input).unwrap(), (1.5, 7));
        assert_eq!(take::<[bool; 2]>("E", &mut input).unwrap(), [true, false]);
        assert_eq!(input, &[9]);
        let err = take::<(f64, u64)>("E", &mut &[0xff][..]).unwrap_err();
        assert!(err.to_string().contains("E"), "{err}");
    }
}
