//! A reader of the OTLP metrics payload clients push (KIP-714: an OpenTelemetry `MetricsData`
//! protobuf), for the numeric data points only: gauges and sums. Histograms, summaries and
//! exemplars are skipped, as is every field not needed to name a series and read its value.
//!
//! Hand-written rather than generated: the few messages read here need about a hundred lines,
//! where `prost` and the OpenTelemetry protos would add a code generator and several crates for
//! the same result. It never panics on bad input: a truncated or malformed message is an error,
//! and the number of points read is capped by the caller.

/// One numeric data point: the metric's name, the point's attributes, its value.
#[derive(Debug, Clone, PartialEq)]
pub struct DataPoint {
    pub name: String,
    pub attributes: Vec<(String, String)>,
    pub value: f64,
    /// A monotonic sum (a counter) rather than a gauge or a non-monotonic sum.
    pub counter: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// The longest attribute value kept: a label is for telling series apart, not for payloads.
const MAX_ATTRIBUTE_VALUE: usize = 256;

struct Reader<'a> {
    buf: &'a [u8],
}

enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first().ok_or(Malformed("truncated varint"))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Malformed("varint too long"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if n > self.buf.len() {
            return Err(Malformed("truncated field"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The next field's number and value; None at the end of the message.
    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, Malformed> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                let b = self.take(8)?;
                Field::Fixed64(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| Malformed("length too large"))?;
                Field::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Field::Fixed32
            }
            _ => return Err(Malformed("unsupported wire type")),
        };
        Ok(Some((key >> 3, field)))
    }
}

fn utf8(b: &[u8]) -> Result<&str, Malformed> {
    std::str::from_utf8(b).map_err(|_| Malformed("string is not UTF-8"))
}

/// Reads every numeric data point of `MetricsData`, at most `max_points` (the rest are
/// skipped); returns them and the number skipped for the cap.
pub fn data_points(payload: &[u8], max_points: usize) -> Result<(Vec<DataPoint>, usize), Malformed> {
    let mut out = Vec::new();
    let mut skipped = 0;
    // MetricsData.resource_metrics = 1
    let mut md = Reader::new(payload);
    while let Some((n, f)) = md.next()? {
        let (1, Field::Bytes(rm)) = (n, f) else { continue };
        // ResourceMetrics.scope_metrics = 2
        let mut rm = Reader::new(rm);
        while let Some((n, f)) = rm.next()? {
            let (2, Field::Bytes(sm)) = (n, f) else { continue };
            // ScopeMetrics.metrics = 2
            let mut sm = Reader::new(sm);
            while let Some((n, f)) = sm.next()? {
                let (2, Field::Bytes(metric)) = (n, f) else { continue };
                metric_points(metric, max_points, &mut out, &mut skipped)?;
            }
        }
    }
    Ok((out, skipped))
}

/// Metric: name = 1, gauge = 5, sum = 7 (others skipped).
fn metric_points(
    metric: &[u8],
    max_points: usize,
    out: &mut Vec<DataPoint>,
    skipped: &mut usize,
) -> Result<(), Malformed> {
    let mut name = "";
    let mut data: Option<(&[u8], bool)> = None;
    let mut r = Reader::new(metric);
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(b)) => name = utf8(b)?,
            (5, Field::Bytes(b)) => data = Some((b, false)),
            (7, Field::Bytes(b)) => data = Some((b, true)),
            _ => {}
        }
    }
    let Some((data, is_sum)) = data else { return Ok(()) };
    // Gauge/Sum: data_points = 1; Sum.is_monotonic = 3.
    let mut points = Vec::new();
    let mut monotonic = false;
    let mut r = Reader::new(data);
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(b)) => points.push(b),
            (3, Field::Varint(v)) => monotonic = v != 0,
            _ => {}
        }
    }
    for p in points {
        let Some((attributes, value)) = number_point(p)? else { continue };
        if out.len() >= max_points {
            *skipped += 1;
            continue;
        }
        out.push(DataPoint { name: name.to_string(), attributes, value, counter: is_sum && monotonic });
    }
    Ok(())
}

/// NumberDataPoint: as_double = 4 (fixed64), as_int = 6 (sfixed64), attributes = 7.
#[allow(clippy::type_complexity)]
fn number_point(p: &[u8]) -> Result<Option<(Vec<(String, String)>, f64)>, Malformed> {
    let mut value = None;
    let mut attributes = Vec::new();
    let mut r = Reader::new(p);
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (4, Field::Fixed64(bits)) => value = Some(f64::from_bits(bits)),
            (6, Field::Fixed64(bits)) => value = Some(bits as i64 as f64),
            (7, Field::Bytes(kv)) => {
                if let Some(a) = key_value(kv)? {
                    attributes.push(a);
                }
            }
            _ => {}
        }
    }
    Ok(value.map(|v| (attributes, v)))
}

/// KeyValue: key = 1, value = 2 (AnyValue: string 1, bool 2, int 3, double 4; others skipped).
fn key_value(kv: &[u8]) -> Result<Option<(String, String)>, Malformed> {
    let mut key = None;
    let mut value = None;
    let mut r = Reader::new(kv);
    while let Some((n, f)) = r.next()? {
        match (n, f) {
            (1, Field::Bytes(b)) => key = Some(utf8(b)?.to_string()),
            (2, Field::Bytes(any)) => {
                let mut a = Reader::new(any);
                while let Some((n, f)) = a.next()? {
                    value = match (n, f) {
                        (1, Field::Bytes(s)) => Some(utf8(s)?.chars().take(MAX_ATTRIBUTE_VALUE).collect()),
                        (2, Field::Varint(v)) => Some((v != 0).to_string()),
                        (3, Field::Varint(v)) => Some((v as i64).to_string()),
                        (4, Field::Fixed64(bits)) => Some(f64::from_bits(bits).to_string()),
                        _ => value,
                    };
                }
            }
            _ => {}
        }
    }
    Ok(key.zip(value))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn bytes_field(n: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(n << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    fn fixed64_field(n: u64, v: u64, out: &mut Vec<u8>) {
        varint(n << 3 | 1, out);
        out.extend_from_slice(&v.to_le_bytes());
    }

    /// A MetricsData with one resource, one scope and the given (name, is_sum, points), each
    /// point (attributes, value).
    #[allow(clippy::type_complexity)]
    pub(crate) fn metrics_data(metrics: &[(&str, bool, Vec<(Vec<(&str, &str)>, f64)>)]) -> Vec<u8> {
        let mut scope = Vec::new();
        for (name, is_sum, points) in metrics {
            let mut data = Vec::new();
            for (attrs, v) in points {
                let mut p = Vec::new();
                fixed64_field(3, 1, &mut p);
                fixed64_field(4, v.to_bits(), &mut p);
                for (k, val) in attrs {
                    let mut any = Vec::new();
                    bytes_field(1, val.as_bytes(), &mut any);
                    let mut kv = Vec::new();
                    bytes_field(1, k.as_bytes(), &mut kv);
                    bytes_field(2, &any, &mut kv);
                    bytes_field(7, &kv, &mut p);
                }
                bytes_field(1, &p, &mut data);
            }
            if *is_sum {
                varint(2 << 3, &mut data);
                varint(2, &mut data);
                varint(3 << 3, &mut data);
                varint(1, &mut data);
            }
            let mut m = Vec::new();
            bytes_field(1, name.as_bytes(), &mut m);
            bytes_field(2, b"a description", &mut m);
            bytes_field(if *is_sum { 7 } else { 5 }, &data, &mut m);
            bytes_field(2, &m, &mut scope);
        }
        let mut rm = Vec::new();
        bytes_field(1, b"", &mut rm);
        bytes_field(2, &scope, &mut rm);
        let mut md = Vec::new();
        bytes_field(1, &rm, &mut md);
        md
    }

    #[test]
    fn gauges_and_sums_are_read_with_their_attributes() {
        let payload = metrics_data(&[
            ("org.apache.kafka.producer.record.queue.time.avg", false, vec![(vec![], 1.5)]),
            ("org.apache.kafka.producer.node.request.latency.max", true, vec![(vec![("node_id", "1")], 7.0)]),
        ]);
        let (points, skipped) = data_points(&payload, 10).unwrap();
        assert_eq!(skipped, 0);
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].name, "org.apache.kafka.producer.record.queue.time.avg");
        assert_eq!((points[0].value, points[0].counter), (1.5, false));
        assert_eq!(points[1].attributes, vec![("node_id".to_string(), "1".to_string())]);
        assert!(points[1].counter);
        let (points, skipped) = data_points(&payload, 1).unwrap();
        assert_eq!((points.len(), skipped), (1, 1));
    }

    #[test]
    fn malformed_payloads_are_errors_not_panics() {
        let payload = metrics_data(&[("a", false, vec![(vec![("k", "v")], 1.0)])]);
        for end in 0..payload.len() {
            // Any prefix either parses (a shorter message is still a message) or is an error.
            let _ = data_points(&payload[..end], 10);
        }
        assert!(data_points(&[0x0a, 0x05, 0x01], 10).is_err());
        assert!(data_points(&[0x0b], 10).is_err(), "group wire type");
        assert!(data_points(&[0xff; 11], 10).is_err());
        assert_eq!(data_points(&[], 10).unwrap().0, vec![]);
    }
}
