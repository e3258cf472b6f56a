//! Reading a request body field by field ([`Body`]), so that a wrong type
//! or range is a 400 naming the field, and `null` reads as absent (as
//! OpenAI treats it).

use serde_json::{Map, Value};

use super::error::{ApiError, ApiResult};

/// A parsed JSON object body.
#[derive(Clone, Debug)]
pub struct Body {
    map: Map<String, Value>,
}

impl Body {
    /// Parses `bytes` as a JSON object.
    ///
    /// # Errors
    /// Malformed JSON, or JSON that is not an object.
    pub fn parse(bytes: &[u8]) -> ApiResult<Body> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
        match v {
            Value::Object(map) => Ok(Body { map }),
            _ => Err(ApiError::bad_request("the body must be a JSON object")),
        }
    }

    /// Field `name`, `None` when absent or `null`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    /// A boolean field.
    ///
    /// # Errors
    /// Another type.
    pub fn bool(&self, name: &str) -> ApiResult<Option<bool>> {
        self.get(name).map(|v| v.as_bool().ok_or_else(|| wrong(name, "a boolean"))).transpose()
    }

    /// A string field.
    ///
    /// # Errors
    /// Another type.
    pub fn str(&self, name: &str) -> ApiResult<Option<&str>> {
        self.get(name).map(|v| v.as_str().ok_or_else(|| wrong(name, "a string"))).transpose()
    }

    /// A number field in `[lo, hi]`.
    ///
    /// # Errors
    /// Another type, or out of range.
    pub fn number(&self, name: &str, lo: f64, hi: f64) -> ApiResult<Option<f64>> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let x = v.as_f64().ok_or_else(|| wrong(name, "a number"))?;
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::invalid(name, format!("{name} is {x}; it must be between {lo} and {hi}")));
        }
        Ok(Some(x))
    }

    /// An integer field in `[lo, hi]`.
    ///
    /// # Errors
    /// Another type (a fraction too), or out of range.
    pub fn int(&self, name: &str, lo: i64, hi: i64) -> ApiResult<Option<i64>> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let x = match (v.as_i64(), v.as_u64(), v.as_f64()) {
            (Some(x), _, _) => x,
            (None, Some(_), _) => i64::MAX,
            // An integer past 64 bits arrives as a float: out of range.
            (None, None, Some(f)) if f.is_finite() && f.abs() >= 9.2e18 => {
                if f > 0.0 {
                    i64::MAX
                } else {
                    i64::MIN
                }
            }
            _ => return Err(wrong(name, "an integer")),
        };
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::invalid(name, format!("{name} is {v}; it must be between {lo} and {hi}")));
        }
        Ok(Some(x))
    }

    /// An unsigned 64-bit field (a seed), any value.
    ///
    /// # Errors
    /// Another type. A negative integer is taken modulo 2^64, as llama-server's `-1` seeds.
    pub fn u64(&self, name: &str) -> ApiResult<Option<u64>> {
        let Some(v) = self.get(name) else { return Ok(None) };
        match (v.as_u64(), v.as_i64()) {
            (Some(x), _) => Ok(Some(x)),
            (None, Some(x)) => Ok(Some(x as u64)),
            _ if v.as_f64().is_some_and(|f| f.is_finite() && f.abs() >= 1.8e19) => {
                Err(wrong(name, "an integer of at most 64 bits"))
            }
            _ => Err(wrong(name, "an integer")),
        }
    }
}

/// A 400: `name` must be `what`.
pub fn wrong(name: &str, what: &str) -> ApiError {
    ApiError::invalid(name, format!("{name} must be {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_typed_and_ranged() {
        let b =
            Body::parse(br#"{"a": 1.5, "b": "x", "c": null, "d": -3, "e": true, "f": 18446744073709551615}"#).unwrap();
        assert_eq!(b.number("a", 0.0, 2.0).unwrap(), Some(1.5));
        assert_eq!(b.number("a", 0.0, 1.0).unwrap_err().param.as_deref(), Some("a"));
        assert_eq!(b.str("b").unwrap(), Some("x"));
        assert_eq!(b.str("a").unwrap_err().param.as_deref(), Some("a"));
        assert_eq!(b.int("c", 0, 1).unwrap(), None);
        assert!(b.int("a", 0, 5).is_err(), "a fraction is not an integer");
        let big = Body::parse(br#"{"n": 1e30, "m": -1e30}"#).unwrap();
        for f in ["n", "m"] {
            let e = big.int(f, 0, 5).unwrap_err();
            assert!(e.message.contains("must be between"), "{f}: {}", e.message);
        }
        assert!(big.u64("n").unwrap_err().message.contains("64 bits"));
        let float = Body::parse(br#"{"n": 5.0}"#).unwrap();
        assert!(float.int("n", 0, 9).unwrap_err().message.contains("an integer"));
        assert!(b.int("d", 1, 5).is_err());
        assert!(b.int("f", 1, 5).is_err());
        assert_eq!(b.bool("e").unwrap(), Some(true));
        assert_eq!(b.u64("d").unwrap(), Some((-3i64) as u64));
        assert!(Body::parse(b"[1]").is_err());
        assert!(Body::parse(b"{").is_err());
    }
}
