//! The JAAS configuration text Kafka takes in `sasl.jaas.config`:
//! `<LoginModule> <flag> key=value key="value" ... ;`, possibly several entries. Values in
//! double quotes may hold spaces and `\` escapes, as Java's `StreamTokenizer` reads them.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginModule {
    pub class: String,
    pub flag: String,
    pub options: BTreeMap<String, String>,
}

pub fn parse(text: &str) -> Result<Vec<LoginModule>, String> {
    let tokens = tokenize(text)?;
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let class = match &tokens[i] {
            Token::Word(w) => w.clone(),
            other => return Err(format!("expected a login module class name, found {other:?}")),
        };
        let flag = match tokens.get(i + 1) {
            Some(Token::Word(f)) if matches!(f.as_str(), "required" | "requisite" | "sufficient" | "optional") => {
                f.clone()
            }
            _ => {
                return Err(format!(
                    "login module {class}: expected a flag (required, requisite, sufficient, optional)"
                ))
            }
        };
        i += 2;
        let mut options = BTreeMap::new();
        loop {
            match tokens.get(i) {
                Some(Token::Semicolon) => {
                    i += 1;
                    break;
                }
                Some(Token::Word(key)) => {
                    if tokens.get(i + 1) != Some(&Token::Equals) {
                        return Err(format!("login module {class}: option {key} has no value"));
                    }
                    let value = match tokens.get(i + 2) {
                        Some(Token::Word(v)) | Some(Token::Quoted(v)) => v.clone(),
                        _ => return Err(format!("login module {class}: option {key} has no value")),
                    };
                    options.insert(key.clone(), value);
                    i += 3;
                }
                None => return Err(format!("login module {class}: missing ';' at the end")),
                Some(other) => return Err(format!("login module {class}: unexpected {other:?}")),
            }
        }
        out.push(LoginModule { class, flag, options });
    }
    if out.is_empty() {
        return Err("no login module".into());
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(String),
    Quoted(String),
    Equals,
    Semicolon,
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '=' => {
                chars.next();
                out.push(Token::Equals);
            }
            ';' => {
                chars.next();
                out.push(Token::Semicolon);
            }
            '"' => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        None => return Err("unterminated quoted value".into()),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some(o) => s.push(o),
                            None => return Err("unterminated quoted value".into()),
                        },
                        Some(o) => s.push(o),
                    }
                }
                out.push(Token::Quoted(s));
            }
            _ => {
                let mut s = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || c == '=' || c == ';' || c == '"' {
                        break;
                    }
                    s.push(c);
                    chars.next();
                }
                out.push(Token::Word(s));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_login_module_as_kafka_documents_it() {
        let m = parse(
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required
               username="admin" password="admin-secret"
               user_admin="admin-secret" user_alice="alice \"quoted\" secret";"#,
        )
        .unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].class, "org.apache.kafka.common.security.plain.PlainLoginModule");
        assert_eq!(m[0].options["username"], "admin");
        assert_eq!(m[0].options["user_alice"], "alice \"quoted\" secret");
        let two = parse("a.B required; c.D optional x=y;").unwrap();
        assert_eq!(two[1].options["x"], "y");
        assert!(parse("a.B required username=\"x\"").is_err());
        assert!(parse("a.B sometimes;").is_err());
        assert!(parse("").is_err());
    }
}
